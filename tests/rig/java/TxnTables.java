package hmsproxy.rig;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hive.conf.HiveConf;
import org.apache.hadoop.hive.metastore.MetaStoreEventListener;
import org.apache.hadoop.hive.metastore.txn.TxnDbUtil;

/**
 * Test-rig helper: makes the metastore able to grant locks. Hive 2.3's TxnHandler keeps locks
 * and transactions in tables (TXNS, HIVE_LOCKS, ...) that DataNucleus does not create and that
 * schematool would; on Derby nothing creates them, and lock() then kills the HMS worker thread.
 * Registered as an event listener only so that the metastore constructs it at start-up, before
 * it serves a call; it creates the tables with Hive's own DDL (TxnDbUtil.prepDb) if they are
 * missing, and listens to nothing.
 */
public class TxnTables extends MetaStoreEventListener {
  public TxnTables(Configuration config) throws Exception {
    super(config);
    String url = config.get("javax.jdo.option.ConnectionURL", "");
    if (!url.startsWith("jdbc:derby:")) return;
    try (Connection c = DriverManager.getConnection(url);
        ResultSet found = c.getMetaData().getTables(null, "APP", "HIVE_LOCKS", null)) {
      if (found.next()) return;
    }
    TxnDbUtil.prepDb(new HiveConf(config, TxnTables.class));
  }
}
