package hmsproxy.rig;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * What the rig's metastore sees of s3:// and s3a:// locations.
 *
 * <p>The pyspark jars have no S3 filesystem (hadoop-aws), and the metastore resolves every
 * location it is given (to qualify it, to check the directory exists, to count files for
 * statistics). This stand-in answers those questions plausibly: every path is an empty
 * directory. The proxy never goes through it: it lists the objects itself, from the
 * S3-compatible server the tests start.
 */
public class ObjectStoreStub extends FileSystem {
  private URI uri;
  private Path workingDirectory = new Path("/");

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    uri = URI.create(name.getScheme() + "://" + name.getAuthority());
    setConf(conf);
  }

  @Override
  public String getScheme() {
    return uri == null ? "s3a" : uri.getScheme();
  }

  @Override
  public URI getUri() {
    return uri;
  }

  @Override
  public FileStatus getFileStatus(Path path) {
    return new FileStatus(0, true, 1, 0, 0, makeQualified(path));
  }

  @Override
  public FileStatus[] listStatus(Path path) {
    return new FileStatus[0];
  }

  @Override
  public boolean mkdirs(Path path, FsPermission permission) {
    return true;
  }

  @Override
  public boolean delete(Path path, boolean recursive) {
    return true;
  }

  @Override
  public boolean rename(Path from, Path to) {
    return true;
  }

  @Override
  public FSDataInputStream open(Path path, int bufferSize) throws IOException {
    throw new FileNotFoundException("the rig's object store holds no data: " + path);
  }

  @Override
  public FSDataOutputStream create(
      Path path,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    throw new IOException("the rig's object store is read-only: " + path);
  }

  @Override
  public FSDataOutputStream append(Path path, int bufferSize, Progressable progress)
      throws IOException {
    throw new IOException("the rig's object store is read-only: " + path);
  }

  @Override
  public void setWorkingDirectory(Path path) {
    workingDirectory = path;
  }

  @Override
  public Path getWorkingDirectory() {
    return workingDirectory;
  }
}
