package hmsproxy.rig;

import java.sql.Clob;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * Test-rig helper (tests/rig/bulk_partitions.py): clones a table's one partition into many,
 * straight in a Hive 2.3 metastore's embedded Derby database while no metastore has it open.
 * Through Thrift, 2.3 on Derby adds about 80 partitions a second; this inserts the same rows
 * DataNucleus would (seven a partition), about 5,000 partitions a second here.
 *
 * <p>Arguments: the Derby folder, the database, the table, how many partitions the table is
 * to have, and the digits of their values: the template's value is 0 and the clones are 1 to
 * count - 1, zero-padded ("ds=00000001"), so names sort as numbers do. A clone shares the
 * template's column descriptor (CDS), as Hive's own partitions with the table's columns do;
 * it gets its own storage descriptor, serde and parameters, with ids taken from DataNucleus's
 * SEQUENCE_TABLE, which is then advanced past them so the metastore's own writes do not
 * collide. What a clone would need and this does not copy (skew values, privileges, column
 * statistics of the template) is refused.
 */
public class BulkPartitions {
  static final String MODEL = "org.apache.hadoop.hive.metastore.model.";
  // Clones per executeBatch. All in one transaction: a run that fails leaves the template
  // alone, to clone again (Derby escalates the row locks to table locks; no slower here).
  static final int BATCH = 2_000;

  /** A table's rows that belong to the template, and the statement that inserts copies. */
  static final class Owned {
    final String[] columns;
    final List<Object[]> rows = new ArrayList<>();
    final PreparedStatement insert;

    Owned(Connection c, String table, String key, long id) throws SQLException {
      try (PreparedStatement s = c.prepareStatement(
          "SELECT * FROM " + table + " WHERE " + key + " = ?")) {
        s.setLong(1, id);
        try (ResultSet r = s.executeQuery()) {
          ResultSetMetaData md = r.getMetaData();
          columns = new String[md.getColumnCount()];
          for (int i = 0; i < columns.length; i++) columns[i] = md.getColumnName(i + 1);
          while (r.next()) {
            Object[] row = new Object[columns.length];
            for (int i = 0; i < columns.length; i++) {
              Object v = r.getObject(i + 1);
              row[i] = v instanceof Clob ? ((Clob) v).getSubString(1, (int) ((Clob) v).length())
                  : v;
            }
            rows.add(row);
          }
        }
      }
      StringBuilder sql = new StringBuilder("INSERT INTO " + table + " (");
      for (int i = 0; i < columns.length; i++) {
        // Quoted: SORT_COLS has a column named ORDER.
        sql.append(i == 0 ? "" : ", ").append('"').append(columns[i]).append('"');
      }
      sql.append(") VALUES (").append("?, ".repeat(columns.length - 1)).append("?)");
      insert = c.prepareStatement(sql.toString());
    }

    /** Adds a copy of each row to the batch, with ``set``'s columns replaced. */
    void add(Map<String, Object> set) throws SQLException {
      for (Object[] row : rows) {
        for (int i = 0; i < columns.length; i++) {
          insert.setObject(i + 1, set.containsKey(columns[i]) ? set.get(columns[i]) : row[i]);
        }
        insert.addBatch();
      }
    }
  }

  static boolean exists(Connection c, String table) throws SQLException {
    try (ResultSet r = c.getMetaData().getTables(null, "APP", table, null)) {
      return r.next();
    }
  }

  static List<Object[]> query(Connection c, String sql, Object... args) throws SQLException {
    try (PreparedStatement s = c.prepareStatement(sql)) {
      for (int i = 0; i < args.length; i++) s.setObject(i + 1, args[i]);
      try (ResultSet r = s.executeQuery()) {
        List<Object[]> out = new ArrayList<>();
        int n = r.getMetaData().getColumnCount();
        while (r.next()) {
          Object[] row = new Object[n];
          for (int i = 0; i < n; i++) row[i] = r.getObject(i + 1);
          out.add(row);
        }
        return out;
      }
    }
  }

  static Object[] one(Connection c, String what, String sql, Object... args) throws SQLException {
    List<Object[]> rows = query(c, sql, args);
    if (rows.size() != 1) {
      throw new IllegalStateException(what + ": " + rows.size() + " rows, not one");
    }
    return rows.get(0);
  }

  /** The first id to use for ``model``'s rows: DataNucleus's next value (what it handed out
   * before is in use or lost with the metastore that held it), or past the table's ids. */
  static long firstId(Connection c, String model, String table, String id) throws SQLException {
    long next = ((Number) one(c, model,
        "SELECT NEXT_VAL FROM SEQUENCE_TABLE WHERE SEQUENCE_NAME = ?", MODEL + model)[0])
        .longValue();
    Object max = one(c, table, "SELECT MAX(" + id + ") FROM " + table)[0];
    return Math.max(next, max == null ? 1 : ((Number) max).longValue() + 1);
  }

  static void advance(Connection c, String model, long next) throws SQLException {
    try (PreparedStatement s = c.prepareStatement(
        "UPDATE SEQUENCE_TABLE SET NEXT_VAL = ? WHERE SEQUENCE_NAME = ? AND NEXT_VAL < ?")) {
      s.setLong(1, next);
      s.setString(2, MODEL + model);
      s.setLong(3, next);
      s.executeUpdate();
    }
  }

  static void refuseOwned(Connection c, String table, String key, long id) throws SQLException {
    if (!exists(c, table)) return;  // DataNucleus creates a table when it first needs it
    Object n = one(c, table, "SELECT COUNT(*) FROM " + table + " WHERE " + key + " = ?", id)[0];
    if (((Number) n).longValue() != 0) {
      throw new IllegalStateException("the template partition has rows in " + table
          + ", which this does not clone");
    }
  }

  public static void main(String[] args) throws Exception {
    String folder = args[0], db = args[1], table = args[2];
    int count = Integer.parseInt(args[3]), digits = Integer.parseInt(args[4]);
    long started = System.nanoTime();
    try (Connection c = DriverManager.getConnection("jdbc:derby:" + folder)) {
      c.setAutoCommit(false);
      long tblId = ((Number) one(c, db + "." + table, "SELECT t.TBL_ID FROM TBLS t"
          + " JOIN DBS d ON t.DB_ID = d.DB_ID WHERE d.NAME = ? AND t.TBL_NAME = ?",
          db, table)[0]).longValue();
      String key = (String) one(c, "partition keys",
          "SELECT PKEY_NAME FROM PARTITION_KEYS WHERE TBL_ID = ?", tblId)[0];
      Object[] template = one(c, "partitions of " + table,
          "SELECT p.PART_ID, p.SD_ID, s.SERDE_ID, s.LOCATION, p.PART_NAME FROM PARTITIONS p"
          + " JOIN SDS s ON p.SD_ID = s.SD_ID WHERE p.TBL_ID = ?", tblId);
      long partId = ((Number) template[0]).longValue();
      long sdId = ((Number) template[1]).longValue();
      long serdeId = ((Number) template[2]).longValue();
      String location = (String) template[3];
      String zero = String.format("%0" + digits + "d", 0);
      if (!template[4].equals(key + "=" + zero) || !location.endsWith("/" + key + "=" + zero)) {
        throw new IllegalStateException("the template is not " + key + "=" + zero + " at"
            + " <table>/" + key + "=" + zero + ": " + template[4] + " at " + location);
      }
      String base = location.substring(0, location.length() - zero.length());
      refuseOwned(c, "SKEWED_VALUES", "SD_ID_OID", sdId);
      refuseOwned(c, "SKEWED_COL_VALUE_LOC_MAP", "SD_ID", sdId);
      refuseOwned(c, "PART_PRIVS", "PART_ID", partId);
      refuseOwned(c, "PART_COL_PRIVS", "PART_ID", partId);
      refuseOwned(c, "PART_COL_STATS", "PART_ID", partId);

      // In foreign-key order: each batch is executed after those of the rows it refers to.
      Owned serdes = new Owned(c, "SERDES", "SERDE_ID", serdeId);
      Owned serdeParams = new Owned(c, "SERDE_PARAMS", "SERDE_ID", serdeId);
      Owned sds = new Owned(c, "SDS", "SD_ID", sdId);
      List<Owned> sdOwned = new ArrayList<>();
      for (String t : List.of("SD_PARAMS", "BUCKETING_COLS", "SORT_COLS", "SKEWED_COL_NAMES")) {
        if (exists(c, t)) sdOwned.add(new Owned(c, t, "SD_ID", sdId));
      }
      Owned partitions = new Owned(c, "PARTITIONS", "PART_ID", partId);
      Owned keyVals = new Owned(c, "PARTITION_KEY_VALS", "PART_ID", partId);
      Owned partParams = new Owned(c, "PARTITION_PARAMS", "PART_ID", partId);
      List<Owned> all = new ArrayList<>(List.of(serdes, serdeParams, sds));
      all.addAll(sdOwned);
      all.addAll(List.of(partitions, keyVals, partParams));

      long firstSerde = firstId(c, "MSerDeInfo", "SERDES", "SERDE_ID");
      long firstSd = firstId(c, "MStorageDescriptor", "SDS", "SD_ID");
      long firstPart = firstId(c, "MPartition", "PARTITIONS", "PART_ID");
      for (int i = 1; i < count; i++) {
        long serde = firstSerde + i - 1, sd = firstSd + i - 1, part = firstPart + i - 1;
        String value = String.format("%0" + digits + "d", i);
        serdes.add(Map.of("SERDE_ID", serde));
        serdeParams.add(Map.of("SERDE_ID", serde));
        sds.add(Map.of("SD_ID", sd, "SERDE_ID", serde, "LOCATION", base + value));
        for (Owned o : sdOwned) o.add(Map.of("SD_ID", sd));
        partitions.add(Map.of("PART_ID", part, "SD_ID", sd, "PART_NAME", key + "=" + value));
        keyVals.add(Map.of("PART_ID", part, "PART_KEY_VAL", value));
        partParams.add(Map.of("PART_ID", part));
        if (i % BATCH == 0 || i == count - 1) {
          for (Owned o : all) o.insert.executeBatch();
        }
      }
      advance(c, "MSerDeInfo", firstSerde + count - 1);
      advance(c, "MStorageDescriptor", firstSd + count - 1);
      advance(c, "MPartition", firstPart + count - 1);
      c.commit();
    }
    // A clean shutdown: the metastore that opens the folder next has no log to recover.
    try {
      DriverManager.getConnection("jdbc:derby:" + folder + ";shutdown=true");
    } catch (SQLException expected) {
      if (!"08006".equals(expected.getSQLState())) throw expected;
    }
    System.out.printf("cloned %d partitions of %s.%s in %.1f s%n", count - 1, db, table,
        (System.nanoTime() - started) / 1e9);
  }
}
