package hmsproxy.rig.hive4;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hive.metastore.HMSHandler;
import org.apache.hadoop.hive.metastore.TransactionalMetaStoreEventListener;
import org.apache.hadoop.hive.metastore.api.Database;
import org.apache.hadoop.hive.metastore.api.MetaException;
import org.apache.hadoop.hive.metastore.api.NotificationEvent;
import org.apache.hadoop.hive.metastore.api.Partition;
import org.apache.hadoop.hive.metastore.api.Table;
import org.apache.hadoop.hive.metastore.events.AddPartitionEvent;
import org.apache.hadoop.hive.metastore.events.AlterDatabaseEvent;
import org.apache.hadoop.hive.metastore.events.AlterPartitionEvent;
import org.apache.hadoop.hive.metastore.events.AlterTableEvent;
import org.apache.hadoop.hive.metastore.events.CreateDatabaseEvent;
import org.apache.hadoop.hive.metastore.events.CreateFunctionEvent;
import org.apache.hadoop.hive.metastore.events.CreateTableEvent;
import org.apache.hadoop.hive.metastore.events.DropDatabaseEvent;
import org.apache.hadoop.hive.metastore.events.DropFunctionEvent;
import org.apache.hadoop.hive.metastore.events.DropPartitionEvent;
import org.apache.hadoop.hive.metastore.events.DropTableEvent;
import org.apache.hadoop.hive.metastore.events.InsertEvent;
import org.apache.hadoop.hive.metastore.messaging.EventMessage;
import org.apache.hadoop.hive.metastore.messaging.MessageBuilder;
import org.apache.hadoop.hive.metastore.messaging.MessageEncoder;
import org.apache.hadoop.hive.metastore.messaging.MessageFactory;

/**
 * Test-rig stand-in for Hive 4's DbNotificationListener, for the real standalone metastore
 * 4.0.1 (tests/rig/hive_metastore.py): hcatalog's server extensions, where Hive keeps that
 * listener, are not published on Maven Central for 4.0.x (3.1.3's are, and the rig uses the
 * real one there). Registered as a transactional listener, as DbNotificationListener is, it
 * writes each change to the metastore's own notification log inside the change's own
 * transaction (RawStore.addNotificationEvent, which serialises event ids on
 * NOTIFICATION_SEQUENCE), with Hive 4's own messages (MessageBuilder) in the format Hive 4
 * writes by default (hive.metastore.event.message.factory: gzip(json-2.0)).
 */
public class NotificationLog extends TransactionalMetaStoreEventListener {
  private final MessageBuilder messages = MessageBuilder.getInstance();
  private final MessageEncoder encoder;

  public NotificationLog(Configuration config) {
    super(config);
    encoder = MessageFactory.getDefaultInstance(config);
  }

  private void log(String type, String cat, String db, String table, EventMessage message)
      throws MetaException {
    NotificationEvent event =
        new NotificationEvent(
            0,
            (int) (System.currentTimeMillis() / 1000),
            type,
            encoder.getSerializer().serialize(message));
    event.setCatName(cat == null ? "hive" : cat);
    event.setDbName(db);
    event.setTableName(table);
    event.setMessageFormat(encoder.getMessageFormat());
    HMSHandler.getMSForConf(getConf()).addNotificationEvent(event);
  }

  @Override
  public void onCreateDatabase(CreateDatabaseEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Database db = event.getDatabase();
    log("CREATE_DATABASE", db.getCatalogName(), db.getName(), null,
        messages.buildCreateDatabaseMessage(db));
  }

  @Override
  public void onAlterDatabase(AlterDatabaseEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Database before = event.getOldDatabase();
    log("ALTER_DATABASE", before.getCatalogName(), before.getName(), null,
        messages.buildAlterDatabaseMessage(before, event.getNewDatabase()));
  }

  @Override
  public void onDropDatabase(DropDatabaseEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Database db = event.getDatabase();
    log("DROP_DATABASE", db.getCatalogName(), db.getName(), null,
        messages.buildDropDatabaseMessage(db));
  }

  @Override
  public void onCreateTable(CreateTableEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTable();
    log("CREATE_TABLE", t.getCatName(), t.getDbName(), t.getTableName(),
        messages.buildCreateTableMessage(t, Collections.<String>emptyIterator()));
  }

  @Override
  public void onDropTable(DropTableEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTable();
    log("DROP_TABLE", t.getCatName(), t.getDbName(), t.getTableName(),
        messages.buildDropTableMessage(t));
  }

  @Override
  public void onAlterTable(AlterTableEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table before = event.getOldTable();
    log("ALTER_TABLE", before.getCatName(), before.getDbName(), before.getTableName(),
        messages.buildAlterTableMessage(before, event.getNewTable(), event.getIsTruncateOp(),
            event.getWriteId()));
  }

  @Override
  public void onAddPartition(AddPartitionEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTable();
    List<Partition> parts = new ArrayList<>();
    event.getPartitionIterator().forEachRemaining(parts::add);
    log("ADD_PARTITION", t.getCatName(), t.getDbName(), t.getTableName(),
        messages.buildAddPartitionMessage(t, parts.iterator(), Collections.emptyIterator()));
  }

  @Override
  public void onDropPartition(DropPartitionEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTable();
    log("DROP_PARTITION", t.getCatName(), t.getDbName(), t.getTableName(),
        messages.buildDropPartitionMessage(t, event.getPartitionIterator()));
  }

  @Override
  public void onAlterPartition(AlterPartitionEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTable();
    log("ALTER_PARTITION", t.getCatName(), t.getDbName(), t.getTableName(),
        messages.buildAlterPartitionMessage(t, event.getOldPartition(), event.getNewPartition(),
            event.getIsTruncateOp(), event.getWriteId()));
  }

  @Override
  public void onInsert(InsertEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTableObj();
    log("INSERT", t.getCatName(), t.getDbName(), t.getTableName(),
        messages.buildInsertMessage(t, event.getPartitionObj(), event.isReplace(),
            event.getFiles().iterator()));
  }

  @Override
  public void onCreateFunction(CreateFunctionEvent event) throws MetaException {
    if (!event.getStatus()) return;
    log("CREATE_FUNCTION", event.getFunction().getCatName(), event.getFunction().getDbName(),
        null, messages.buildCreateFunctionMessage(event.getFunction()));
  }

  @Override
  public void onDropFunction(DropFunctionEvent event) throws MetaException {
    if (!event.getStatus()) return;
    log("DROP_FUNCTION", event.getFunction().getCatName(), event.getFunction().getDbName(),
        null, messages.buildDropFunctionMessage(event.getFunction()));
  }
}
