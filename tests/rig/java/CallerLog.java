package hmsproxy.rig;

import java.io.FileWriter;
import java.io.IOException;
import java.io.PrintWriter;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hive.metastore.MetaStorePreEventListener;
import org.apache.hadoop.hive.metastore.api.MetaException;
import org.apache.hadoop.hive.metastore.api.Table;
import org.apache.hadoop.hive.metastore.events.PreAddPartitionEvent;
import org.apache.hadoop.hive.metastore.events.PreAlterTableEvent;
import org.apache.hadoop.hive.metastore.events.PreCreateDatabaseEvent;
import org.apache.hadoop.hive.metastore.events.PreCreateTableEvent;
import org.apache.hadoop.hive.metastore.events.PreEventContext;
import org.apache.hadoop.hive.metastore.events.PreReadDatabaseEvent;
import org.apache.hadoop.hive.metastore.events.PreReadTableEvent;
import org.apache.hadoop.security.UserGroupInformation;

/**
 * Test-rig pre-event listener: appends "EVENT target user" for every metastore event to the
 * file named by the hive-site property hmsproxy.rig.caller.log, where the user is the short name
 * of the identity the HMS runs the call as: the set_ugi identity of the connection; in secure
 * mode the SASL-authenticated principal (alice@REALM: alice) or a delegation token's owner, and
 * set_ugi changes nothing. This is how the tests see which user a call reached the real HMS as.
 *
 * Reading a table whose name starts with "slowread", or altering one whose name starts with
 * "slowwrite", takes the HMS three seconds: a real call in flight for the tests (to drain on
 * SIGTERM, to kill the HMS under, or to kill a proxy under between forwarding a write and
 * invalidating it). Adding partitions to a table whose name starts with "slowadd", or reading
 * one whose name starts with "slowlong", takes it ten seconds, as a large add_partitions or
 * partition list does on a busy metastore. Each slow call writes a line to the HMS's log as it
 * begins, so that a test can wait until the call is at the metastore instead of sleeping.
 */
public class CallerLog extends MetaStorePreEventListener {
  static final String SLOW_CALL_STARTED = "hmsproxy.rig.CallerLog: slow call started: ";
  private final String path;

  public CallerLog(Configuration config) {
    super(config);
    path = config.get("hmsproxy.rig.caller.log");
  }

  @Override
  public void onEvent(PreEventContext context) throws MetaException {
    String target = "-";
    if (context instanceof PreReadTableEvent) {
      PreReadTableEvent e = (PreReadTableEvent) context;
      target = e.getTable().getDbName() + "." + e.getTable().getTableName();
    } else if (context instanceof PreCreateTableEvent) {
      PreCreateTableEvent e = (PreCreateTableEvent) context;
      target = e.getTable().getDbName() + "." + e.getTable().getTableName();
    } else if (context instanceof PreCreateDatabaseEvent) {
      target = ((PreCreateDatabaseEvent) context).getDatabase().getName();
    } else if (context instanceof PreReadDatabaseEvent) {
      target = ((PreReadDatabaseEvent) context).getDatabase().getName();
    } else if (context instanceof PreAlterTableEvent) {
      Table t = ((PreAlterTableEvent) context).getOldTable();
      target = t.getDbName() + "." + t.getTableName();
    } else if (context instanceof PreAddPartitionEvent) {
      Table t = ((PreAddPartitionEvent) context).getTable();
      target = t.getDbName() + "." + t.getTableName();
    }
    boolean long_ =
        (context instanceof PreAddPartitionEvent && target.contains(".slowadd"))
            || (context instanceof PreReadTableEvent && target.contains(".slowlong"));
    boolean slow =
        (context instanceof PreReadTableEvent && target.contains(".slowread"))
            || (context instanceof PreAlterTableEvent && target.contains(".slowwrite"));
    if (long_ || slow) {
      // What the tests wait for (MetastoreServer.slow_calls_started): the call is here now.
      System.err.println(SLOW_CALL_STARTED + context.getEventType().name() + " " + target);
      System.err.flush();
    }
    if (long_) {
      try {
        Thread.sleep(10000);
      } catch (InterruptedException exc) {
        Thread.currentThread().interrupt();
      }
    }
    if (slow) {
      try {
        Thread.sleep(3000);
      } catch (InterruptedException exc) {
        Thread.currentThread().interrupt();
      }
    }
    try {
      String user = UserGroupInformation.getCurrentUser().getShortUserName();
      synchronized (CallerLog.class) {
        try (PrintWriter out = new PrintWriter(new FileWriter(path, true))) {
          out.println(context.getEventType().name() + " " + target + " " + user);
        }
      }
    } catch (IOException exc) {
      throw new MetaException("caller log: " + exc);
    }
  }
}
