package hmsproxy.rig;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hive.metastore.HiveMetaStore;
import org.apache.hadoop.hive.metastore.MetaStoreEventListener;
import org.apache.hadoop.hive.metastore.RawStore;
import org.apache.hadoop.hive.metastore.api.Database;
import org.apache.hadoop.hive.metastore.api.MetaException;
import org.apache.hadoop.hive.metastore.api.NotificationEvent;
import org.apache.hadoop.hive.metastore.api.Partition;
import org.apache.hadoop.hive.metastore.api.Table;
import org.apache.hadoop.hive.metastore.events.AddPartitionEvent;
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
import org.apache.hadoop.hive.metastore.messaging.MessageFactory;

/**
 * Test-rig stand-in for Hive's DbNotificationListener (which the pyspark jars lack): it writes
 * every successful change to the metastore's own notification log, in Hive 2.3's json-0.2
 * messages, so get_next_notification on the real server returns them.
 *
 * The log's table is created as Hive's schematool creates it, with MESSAGE a CLOB: the schema
 * DataNucleus would derive on its own makes it a LONG VARCHAR of at most 32,700 characters, too
 * small for the message of an add_partitions of a few dozen partitions.
 *
 * Creating a database named "rig_purge_notifications" is a control signal, not logged: it
 * deletes the events older than one second, as the HMS's own time-to-live cleaner would, so
 * tests can produce a gap in the log.
 */
public class NotificationLog extends MetaStoreEventListener {
  private final MessageFactory messages = MessageFactory.getInstance();

  public NotificationLog(Configuration config) throws SQLException {
    super(config);
    String url = config.get("javax.jdo.option.ConnectionURL", "");
    if (url.startsWith("jdbc:derby:")) {
      createLogTable(url);
    }
  }

  private static void createLogTable(String url) throws SQLException {
    try (Connection c = DriverManager.getConnection(url)) {
      try (ResultSet found = c.getMetaData().getTables(null, "APP", "NOTIFICATION_LOG", null)) {
        if (found.next()) return;
      }
      try (Statement s = c.createStatement()) {
        s.execute(
            "CREATE TABLE \"APP\".\"NOTIFICATION_LOG\" (\"NL_ID\" BIGINT NOT NULL, "
                + "\"DB_NAME\" VARCHAR(128), \"EVENT_ID\" BIGINT NOT NULL, "
                + "\"EVENT_TIME\" INTEGER NOT NULL, \"EVENT_TYPE\" VARCHAR(32) NOT NULL, "
                + "\"MESSAGE\" CLOB, \"TBL_NAME\" VARCHAR(256), \"MESSAGE_FORMAT\" VARCHAR(16), "
                + "PRIMARY KEY (\"NL_ID\"))");
      }
    }
  }

  private RawStore store() throws MetaException {
    return HiveMetaStore.HMSHandler.getMSForConf(getConf());
  }

  private void log(String type, String db, String table, Object message) throws MetaException {
    NotificationEvent event =
        new NotificationEvent(0, (int) (System.currentTimeMillis() / 1000), type, message.toString());
    event.setDbName(db);
    event.setTableName(table);
    event.setMessageFormat(messages.getMessageFormat());
    store().addNotificationEvent(event);
  }

  @Override
  public void onCreateDatabase(CreateDatabaseEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Database db = event.getDatabase();
    if (db.getName().equals("rig_purge_notifications")) {
      store().cleanNotificationEvents(1);
      return;
    }
    log("CREATE_DATABASE", db.getName(), null, messages.buildCreateDatabaseMessage(db));
  }

  @Override
  public void onDropDatabase(DropDatabaseEvent event) throws MetaException {
    if (!event.getStatus() || event.getDatabase().getName().equals("rig_purge_notifications")) return;
    Database db = event.getDatabase();
    log("DROP_DATABASE", db.getName(), null, messages.buildDropDatabaseMessage(db));
  }

  @Override
  public void onCreateTable(CreateTableEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTable();
    log("CREATE_TABLE", t.getDbName(), t.getTableName(),
        messages.buildCreateTableMessage(t, Collections.<String>emptyIterator()));
  }

  @Override
  public void onDropTable(DropTableEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTable();
    log("DROP_TABLE", t.getDbName(), t.getTableName(), messages.buildDropTableMessage(t));
  }

  @Override
  public void onAlterTable(AlterTableEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table before = event.getOldTable();
    Table after = event.getNewTable();
    log("ALTER_TABLE", before.getDbName(), before.getTableName(),
        messages.buildAlterTableMessage(before, after));
  }

  @Override
  public void onAddPartition(AddPartitionEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTable();
    List<Partition> parts = new ArrayList<>();
    event.getPartitionIterator().forEachRemaining(parts::add);
    log("ADD_PARTITION", t.getDbName(), t.getTableName(),
        messages.buildAddPartitionMessage(t, parts.iterator(), Collections.emptyIterator()));
  }

  @Override
  public void onDropPartition(DropPartitionEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTable();
    log("DROP_PARTITION", t.getDbName(), t.getTableName(),
        messages.buildDropPartitionMessage(t, event.getPartitionIterator()));
  }

  @Override
  public void onAlterPartition(AlterPartitionEvent event) throws MetaException {
    if (!event.getStatus()) return;
    Table t = event.getTable();
    log("ALTER_PARTITION", t.getDbName(), t.getTableName(),
        messages.buildAlterPartitionMessage(t, event.getOldPartition(), event.getNewPartition()));
  }

  @Override
  public void onInsert(InsertEvent event) throws MetaException {
    if (!event.getStatus()) return;
    log("INSERT", event.getDb(), event.getTable(),
        messages.buildInsertMessage(event.getDb(), event.getTable(), event.getPartitionKeyValues(),
            event.getFiles().iterator()));
  }

  @Override
  public void onCreateFunction(CreateFunctionEvent event) throws MetaException {
    if (!event.getStatus()) return;
    log("CREATE_FUNCTION", event.getFunction().getDbName(), null,
        messages.buildCreateFunctionMessage(event.getFunction()));
  }

  @Override
  public void onDropFunction(DropFunctionEvent event) throws MetaException {
    if (!event.getStatus()) return;
    log("DROP_FUNCTION", event.getFunction().getDbName(), null,
        messages.buildDropFunctionMessage(event.getFunction()));
  }
}
