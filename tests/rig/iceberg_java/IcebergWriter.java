import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.LinkedBlockingQueue;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.AppendFiles;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.Schema;
import org.apache.iceberg.Table;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.data.GenericRecord;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.data.parquet.GenericParquetWriter;
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.exceptions.CommitStateUnknownException;
import org.apache.iceberg.hive.HiveCatalog;
import org.apache.iceberg.io.DataWriter;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.metrics.CommitReport;
import org.apache.iceberg.metrics.MetricsReport;
import org.apache.iceberg.metrics.MetricsReporter;
import org.apache.iceberg.parquet.Parquet;
import org.apache.iceberg.types.Types;

/**
 * A Java Iceberg writer for the rig: Iceberg's own HiveCatalog (lock-based commits: {@code lock},
 * {@code check_lock} polling, {@code get_table} inside the lock, {@code
 * alter_table_with_environment_context}, {@code unlock}, each on a pooled metastore connection),
 * committing appends of one Parquet data file each.
 *
 * <p>Arguments: URI TABLE(db.name) WRITER N WAREHOUSE_URI [--wait]. Creates the namespace and the
 * table (one optional string column {@code tag}, field id 1, as the pyiceberg tests make it) if
 * they are missing, then makes N appends; append {@code i} holds {@code i % 3 + 1} records tagged
 * {@code WRITER-i-k}. With --wait it prints {@code READY} once the table is loaded and waits for
 * a line on stdin before the first append, so that several writers start together.
 *
 * <p>On stdout, one line per append: {@code COMMIT <snapshot id> <records> <attempts> WRITER-i}
 * for an acknowledged commit (commit() returned; attempts counts Iceberg's retries after conflicts, from
 * its CommitReport), {@code FAILED <i> <exception>} for one that was not; then {@code DONE}.
 * Logs go to stderr.
 */
public class IcebergWriter {
  /** The CommitReports of this JVM's commits (the catalog makes the reporter by class name). */
  static final LinkedBlockingQueue<CommitReport> REPORTS = new LinkedBlockingQueue<>();

  public static class Reports implements MetricsReporter {
    public Reports() {}

    @Override
    public void report(MetricsReport report) {
      if (report instanceof CommitReport) {
        REPORTS.add((CommitReport) report);
      }
    }
  }

  public static void main(String[] args) throws Exception {
    String uri = args[0];
    TableIdentifier ident = TableIdentifier.parse(args[1]);
    String writer = args[2];
    int n = Integer.parseInt(args[3]);
    String warehouse = args[4];
    boolean waitForGo = args.length > 5 && args[5].equals("--wait");

    Configuration conf = new Configuration();
    conf.set("hive.metastore.uris", uri);
    // The rig's metastore reaps a lock not heartbeated for 5 s (Hive's default: 300 s).
    conf.set("iceberg.hive.lock-heartbeat-interval-ms", "1000");
    conf.set("iceberg.hive.lock-check-max-wait-ms", "500");
    conf.set("iceberg.hive.lock-timeout-ms", "60000");
    HiveCatalog catalog = new HiveCatalog();
    catalog.setConf(conf);
    Map<String, String> properties = new HashMap<>();
    properties.put("uri", uri);
    properties.put("warehouse", warehouse);
    properties.put("metrics-reporter-impl", Reports.class.getName());
    catalog.initialize("rig", properties);

    Table table = loadOrCreate(catalog, ident);
    if (waitForGo) {
      System.out.println("READY");
      System.out.flush();
      new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
    }
    for (int i = 0; i < n; i++) {
      int records = i % 3 + 1;
      try {
        DataFile file = dataFile(table, writer + "-" + i, records);
        AppendFiles append = table.newAppend().appendFile(file).set("rig.writer", writer);
        append.commit();
        CommitReport report = REPORTS.take();
        System.out.printf(
            "COMMIT %d %d %d %s-%d%n",
            report.snapshotId(),
            records,
            report.commitMetrics().attempts().value(),
            writer,
            i);
      } catch (CommitFailedException | CommitStateUnknownException e) {
        System.out.printf("FAILED %d %s%n", i, oneLine(e));
      }
      System.out.flush();
    }
    System.out.println("DONE");
    System.out.flush();
    catalog.close();
  }

  static Table loadOrCreate(HiveCatalog catalog, TableIdentifier ident) {
    if (catalog.tableExists(ident)) {
      return catalog.loadTable(ident);
    }
    try {
      catalog.createNamespace(Namespace.of(ident.namespace().levels()));
    } catch (AlreadyExistsException e) {
      // another writer made it
    }
    Schema schema = new Schema(Types.NestedField.optional(1, "tag", Types.StringType.get()));
    try {
      return catalog.createTable(ident, schema);
    } catch (AlreadyExistsException e) {
      return catalog.loadTable(ident);
    }
  }

  /** One Parquet file of {@code records} rows in the table's data folder. */
  static DataFile dataFile(Table table, String tag, int records) throws Exception {
    OutputFile out =
        table.io().newOutputFile(table.locationProvider().newDataLocation(tag + ".parquet"));
    DataWriter<Record> writer =
        Parquet.writeData(out)
            .schema(table.schema())
            .createWriterFunc(GenericParquetWriter::create)
            .withSpec(table.spec())
            .overwrite()
            .build();
    try {
      for (int k = 0; k < records; k++) {
        GenericRecord row = GenericRecord.create(table.schema());
        row.setField("tag", tag + "-" + k);
        writer.write(row);
      }
    } finally {
      writer.close();
    }
    return writer.toDataFile();
  }

  static String oneLine(Throwable e) {
    return (e.getClass().getSimpleName() + ": " + e.getMessage()).replace('\n', ' ');
  }
}
