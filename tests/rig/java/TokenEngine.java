import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.security.PrivilegedExceptionAction;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.hive.conf.HiveConf;
import org.apache.hadoop.hive.conf.HiveConf.ConfVars;
import org.apache.hadoop.hive.metastore.HiveMetaStoreClient;
import org.apache.hadoop.hive.metastore.api.Database;
import org.apache.hadoop.hive.shims.Utils;
import org.apache.hadoop.hive.thrift.DelegationTokenIdentifier;
import org.apache.hadoop.security.UserGroupInformation;
import org.apache.hadoop.security.token.Token;

/**
 * A delegation-token engine made of Hive 2.3.10's own metastore client, as HiveServer2 (doAs)
 * hands tokens to its tasks and Trino uses them with impersonation:
 *
 * <ol>
 *   <li>As the Kerberos user (UserGroupInformation.loginUserFromKeytab), a HiveMetaStoreClient
 *       over SASL GSSAPI to the service principal gets {@code getDelegationToken(user, user)}.
 *   <li>A UGI with no Kerberos credentials at all ({@code createRemoteUser(user)}) is given the
 *       token under a service name (Hive's {@code Utils.setTokenStr(ugi, token, signature)}, as
 *       HiveServer2 does), {@code hive.metastore.token.signature} is set to that name, and a new
 *       HiveMetaStoreClient is opened inside {@code ugi.doAs}: its open() finds the token with
 *       {@code Utils.getTokenStrForm(signature)} and connects with SASL DIGEST-MD5. It creates
 *       a database and reads it back.
 * </ol>
 *
 * <p>Arguments: URI SERVICE_PRINCIPAL USER_PRINCIPAL KEYTAB DATABASE LOCATION. The URI's host
 * replaces _HOST in the service principal (thrift://localhost:PORT, proxy/_HOST@REALM). Needs
 * -Djava.security.krb5.conf for the realm. One JSON object on stdout (logs go to stderr):
 *
 * <pre>
 *   {"login": "alice@REALM", "login_auth": "KERBEROS", "token": true,
 *    "token_owner": ..., "token_renewer": ..., "token_real_user": ...,
 *    "holder": "alice", "holder_auth": "SIMPLE", "holder_kerberos": false,
 *    "token_selected": true, "created": "db", "read": "db", "read_location": ...,
 *    "databases": [...]}
 * </pre>
 *
 * Exits 1 with the error on stderr if a step fails.
 */
public class TokenEngine {
  // The service name the token is filed under in the holder's credentials (HiveServer2 uses
  // "hiveserver2ClientToken"; any name works if hive.metastore.token.signature says it).
  static final String SIGNATURE = "hmsproxy.rig.TokenEngine";

  public static void main(String[] args) throws Exception {
    if (args.length != 6) {
      System.err.println(
          "usage: TokenEngine URI SERVICE_PRINCIPAL USER_PRINCIPAL KEYTAB DATABASE LOCATION");
      System.exit(2);
    }
    String uri = args[0];
    String service = args[1];
    String userPrincipal = args[2];
    String keytab = args[3];
    String name = args[4];
    String location = args[5];
    Map<String, Object> out = new LinkedHashMap<>();

    // (a) The Kerberos user asks the metastore at URI for a token of its own.
    HiveConf conf = conf(uri, service);
    UserGroupInformation.setConfiguration(conf);
    UserGroupInformation.loginUserFromKeytab(userPrincipal, keytab);
    UserGroupInformation login = UserGroupInformation.getLoginUser();
    String user = login.getShortUserName();
    out.put("login", login.getUserName());
    out.put("login_auth", login.getAuthenticationMethod().toString());
    String tokenStr;
    HiveMetaStoreClient kerberos = new HiveMetaStoreClient(conf);
    try {
      tokenStr = kerberos.getDelegationToken(user, user);
    } finally {
      kerberos.close();
    }
    out.put("token", tokenStr != null && !tokenStr.isEmpty());
    Token<DelegationTokenIdentifier> token = new Token<>();
    token.decodeFromUrlString(tokenStr);
    DelegationTokenIdentifier id = new DelegationTokenIdentifier();
    id.readFields(new DataInputStream(new ByteArrayInputStream(token.getIdentifier())));
    out.put("token_kind", token.getKind().toString());
    out.put("token_owner", id.getOwner().toString());
    out.put("token_renewer", id.getRenewer().toString());
    out.put("token_real_user", id.getRealUser().toString());

    // (b) A holder of the token only: no Kerberos credentials, the token under SIGNATURE.
    UserGroupInformation holder = UserGroupInformation.createRemoteUser(user);
    Utils.setTokenStr(holder, tokenStr, SIGNATURE);
    out.put("holder", holder.getUserName());
    out.put("holder_auth", holder.getAuthenticationMethod().toString());
    out.put("holder_kerberos", holder.hasKerberosCredentials());
    HiveConf tokenConf = conf(uri, service);
    tokenConf.setVar(ConfVars.METASTORE_TOKEN_SIGNATURE, SIGNATURE);
    holder.doAs(
        (PrivilegedExceptionAction<Void>)
            () -> {
              // What HiveMetaStoreClient.open() will pick: non-null means DIGEST-MD5.
              out.put("token_selected", Utils.getTokenStrForm(SIGNATURE) != null);
              HiveMetaStoreClient client = new HiveMetaStoreClient(tokenConf);
              try {
                client.createDatabase(
                    new Database(name, "made with a delegation token", location, new HashMap<>()));
                out.put("created", name);
                Database read = client.getDatabase(name);
                out.put("read", read.getName());
                out.put("read_location", read.getLocationUri());
                out.put("databases", client.getAllDatabases());
              } finally {
                client.close();
              }
              return null;
            });
    System.out.println(json(out));
    System.out.flush();
  }

  static HiveConf conf(String uri, String service) {
    HiveConf conf = new HiveConf();
    conf.setVar(ConfVars.METASTOREURIS, uri);
    conf.setBoolVar(ConfVars.METASTORE_USE_THRIFT_SASL, true);
    conf.setVar(ConfVars.METASTORE_KERBEROS_PRINCIPAL, service);
    conf.set("hadoop.security.authentication", "kerberos");
    // Fail at once rather than retry for seconds (the test wants the first error).
    conf.setIntVar(ConfVars.METASTORETHRIFTCONNECTIONRETRIES, 1);
    conf.setIntVar(ConfVars.METASTORETHRIFTFAILURERETRIES, 1);
    conf.set(ConfVars.METASTORE_CLIENT_SOCKET_TIMEOUT.varname, "30s");
    return conf;
  }

  static String json(Object value) {
    if (value == null) return "null";
    if (value instanceof Boolean || value instanceof Number) return value.toString();
    if (value instanceof Map) {
      List<String> parts = new ArrayList<>();
      for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
        parts.add(json(e.getKey().toString()) + ": " + json(e.getValue()));
      }
      return "{" + String.join(", ", parts) + "}";
    }
    if (value instanceof List) {
      List<String> parts = new ArrayList<>();
      for (Object o : (List<?>) value) parts.add(json(o));
      return "[" + String.join(", ", parts) + "]";
    }
    StringBuilder s = new StringBuilder("\"");
    for (char c : value.toString().toCharArray()) {
      if (c == '"' || c == '\\') s.append('\\').append(c);
      else if (c < 0x20) s.append(String.format("\\u%04x", (int) c));
      else s.append(c);
    }
    return s.append('"').toString();
  }
}
