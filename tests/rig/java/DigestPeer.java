import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.Constructor;
import java.lang.reflect.Field;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.security.auth.callback.Callback;
import javax.security.auth.callback.CallbackHandler;
import javax.security.auth.callback.NameCallback;
import javax.security.auth.callback.PasswordCallback;
import javax.security.sasl.RealmCallback;
import javax.security.sasl.Sasl;
import javax.security.sasl.SaslClient;
import javax.security.sasl.SaslServer;
import org.apache.hadoop.hive.thrift.DelegationTokenIdentifier;
import org.apache.hadoop.hive.thrift.DelegationTokenSecretManager;
import org.apache.hadoop.io.Text;
import org.apache.hadoop.security.SaslRpcServer;
import org.apache.hadoop.security.token.Token;
import org.apache.thrift.transport.TSaslServerTransport;
import org.apache.thrift.transport.TSocket;
import org.apache.thrift.transport.TTransport;
import org.apache.thrift.transport.TTransportException;

/**
 * A Thrift-SASL DIGEST-MD5 server built the way a Hive 2.3 metastore builds its token side
 * (HadoopThriftAuthBridge.Server.createSaslServerTransportFactory): libthrift's
 * TSaslServerTransport, the JDK's DIGEST-MD5 server with protocol null and server name
 * "default", and Hive's own SaslDigestCallbackHandler over a DelegationTokenSecretManager, so
 * that a password is only right if it is the token's; the user it reports is the one the
 * metastore would run the calls as (the token's owner, found from the authorization ID). After the handshake every frame is echoed: the transport unwraps it, the peer writes
 * the bytes back and flushes (one wrap). For tests/integration/test_sasl_digest_java.py.
 *
 * <p>Arguments: TOKENS QOPSPEC... TOKENS is owner/renewer/realUser[,...]; each QOPSPEC is a
 * javax.security.sasl.qop value with an optional "@maxbuf" (the server's receive buffer), and
 * gets a listener of its own on 127.0.0.1. Lines on stdout:
 *
 * <pre>
 *   TOKEN owner url-string issueDate maxDate sequence masterKey   (per token, Hadoop's encoding)
 *   CHOICE spec qop cipher         (what the JDK's own DIGEST-MD5 client picks from this server)
 *   LISTEN spec port
 *   READY
 *   SESSION port user authzid qop cipher rawSendSize   (per connection, after the handshake)
 *   CLOSED port reason
 * </pre>
 *
 * The cipher is read from the server by reflection (needs --add-opens
 * java.security.sasl/com.sun.security.sasl.digest=ALL-UNNAMED; "?" without). Ends when stdin
 * closes.
 */
public class DigestPeer {
  static final PrintStream OUT = System.out;

  static synchronized void say(String line) {
    OUT.println(line);
    OUT.flush();
  }

  static Map<String, String> props(String spec) {
    String[] parts = spec.split("@");
    Map<String, String> props = new HashMap<>();
    props.put(Sasl.QOP, parts[0]);
    props.put(Sasl.SERVER_AUTH, "true"); // as Hadoop's SaslRpcServer.SASL_PROPS
    if (parts.length > 1) props.put(Sasl.MAX_BUFFER, parts[1]);
    return props;
  }

  static CallbackHandler hiveHandler(DelegationTokenSecretManager mgr) throws Exception {
    Class<?> c =
        Class.forName(
            "org.apache.hadoop.hive.thrift.HadoopThriftAuthBridge$Server$SaslDigestCallbackHandler");
    Constructor<?> k = c.getDeclaredConstructor(DelegationTokenSecretManager.class);
    k.setAccessible(true); // the class is package-private
    return (CallbackHandler) k.newInstance(mgr);
  }

  static String field(SaslServer server, String name) {
    try {
      Class<?> c = server.getClass();
      while (c != null) {
        try {
          Field f = c.getDeclaredField(name);
          f.setAccessible(true);
          Object v = f.get(server);
          return v == null ? "-" : v.toString();
        } catch (NoSuchFieldException e) {
          c = c.getSuperclass();
        }
      }
    } catch (RuntimeException | IllegalAccessException e) {
      // not opened to us
    }
    return "?";
  }

  /** The JDK's DIGEST-MD5 client against a fresh server for spec: which qop and cipher. */
  static String javaChoice(String spec, CallbackHandler serverHandler, Token<?> token)
      throws Exception {
    SaslServer server =
        Sasl.createSaslServer("DIGEST-MD5", null, "default", props(spec), serverHandler);
    // Hadoop's SaslRpcServer.encodeIdentifier / encodePassword (package-private): base64
    String user = Base64.getEncoder().encodeToString(token.getIdentifier());
    char[] password = Base64.getEncoder().encodeToString(token.getPassword()).toCharArray();
    CallbackHandler client =
        callbacks -> {
          for (Callback cb : callbacks) {
            if (cb instanceof NameCallback) ((NameCallback) cb).setName(user);
            else if (cb instanceof PasswordCallback) ((PasswordCallback) cb).setPassword(password);
            else if (cb instanceof RealmCallback)
              ((RealmCallback) cb).setText(((RealmCallback) cb).getDefaultText());
          }
        };
    Map<String, String> clientProps = new HashMap<>();
    clientProps.put(Sasl.QOP, "auth-conf,auth-int,auth"); // the strongest first
    SaslClient sc =
        Sasl.createSaslClient(
            new String[] {"DIGEST-MD5"}, null, null, "default", clientProps, client);
    byte[] challenge = server.evaluateResponse(new byte[0]);
    byte[] response = sc.evaluateChallenge(challenge);
    sc.evaluateChallenge(server.evaluateResponse(response));
    String text = new String(response, StandardCharsets.UTF_8);
    Matcher cipher = Pattern.compile("cipher=\"([^\"]*)\"").matcher(text);
    return sc.getNegotiatedProperty(Sasl.QOP) + " " + (cipher.find() ? cipher.group(1) : "-");
  }

  static void serve(
      Socket socket,
      int port,
      Map<String, String> props,
      CallbackHandler cbh,
      DelegationTokenSecretManager mgr) {
    String reason = "eof";
    try {
      TSaslServerTransport.Factory factory = new TSaslServerTransport.Factory();
      factory.addServerDefinition("DIGEST-MD5", null, "default", props, cbh);
      TTransport transport = factory.getTransport(new TSocket(socket));
      SaslServer server = ((TSaslServerTransport) transport).getSaslServer();
      // The user the metastore runs the calls as (TUGIAssumingProcessor): the authorization
      // ID is the username (the identifier in base64), and the owner comes from it.
      String authzid = server.getAuthorizationID();
      String user = SaslRpcServer.getIdentifier(authzid, mgr).getUser().getUserName();
      say(
          "SESSION "
              + port
              + " "
              + user
              + " "
              + authzid
              + " "
              + server.getNegotiatedProperty(Sasl.QOP)
              + " "
              + field(server, "negotiatedCipher")
              + " "
              + server.getNegotiatedProperty(Sasl.RAW_SEND_SIZE));
      byte[] buffer = new byte[1 << 24];
      while (true) {
        int n;
        try {
          n = transport.read(buffer, 0, buffer.length);
        } catch (TTransportException e) {
          if (e.getType() != TTransportException.END_OF_FILE) reason = e.toString();
          break;
        }
        if (n == 0) continue; // a frame Java unwrapped to nothing (it drops a bad MAC)
        transport.write(buffer, 0, n);
        transport.flush();
      }
    } catch (Throwable e) {
      Throwable cause = e;
      while (cause.getCause() != null) cause = cause.getCause();
      reason = cause.toString();
    } finally {
      try {
        socket.close();
      } catch (Exception e) {
        // closing anyway
      }
      say("CLOSED " + port + " " + reason.replace('\n', ' '));
    }
  }

  public static void main(String[] args) throws Exception {
    long day = 24L * 3600 * 1000;
    DelegationTokenSecretManager mgr = new DelegationTokenSecretManager(day, 7 * day, day, 3600000);
    mgr.startThreads();
    CallbackHandler cbh = hiveHandler(mgr);

    List<Token<DelegationTokenIdentifier>> tokens = new ArrayList<>();
    for (String spec : args[0].split(",")) {
      String[] who = spec.split("/", -1);
      DelegationTokenIdentifier id =
          new DelegationTokenIdentifier(new Text(who[0]), new Text(who[1]), new Text(who[2]));
      Token<DelegationTokenIdentifier> token = new Token<>(id, mgr); // createPassword stores it
      tokens.add(token);
      say(
          "TOKEN "
              + who[0]
              + " "
              + token.encodeToUrlString()
              + " "
              + id.getIssueDate()
              + " "
              + id.getMaxDate()
              + " "
              + id.getSequenceNumber()
              + " "
              + id.getMasterKeyId());
    }

    for (int i = 1; i < args.length; i++) {
      String spec = args[i];
      say("CHOICE " + spec + " " + javaChoice(spec, cbh, tokens.get(0)));
      Map<String, String> props = props(spec);
      ServerSocket listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
      int port = listener.getLocalPort();
      Thread acceptor =
          new Thread(
              () -> {
                while (true) {
                  try {
                    Socket s = listener.accept();
                    Thread t = new Thread(() -> serve(s, port, props, cbh, mgr));
                    t.setDaemon(true);
                    t.start();
                  } catch (Exception e) {
                    return;
                  }
                }
              });
      acceptor.setDaemon(true);
      acceptor.start();
      say("LISTEN " + spec + " " + port);
    }
    say("READY");
    BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in));
    while (stdin.readLine() != null) {
      // until the test closes our stdin
    }
    System.exit(0);
  }
}
