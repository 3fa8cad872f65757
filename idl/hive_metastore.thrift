// Hive Metastore Thrift interface, as spoken by Hive 2.3.10 (the server Spark ships), plus the
// Hive 3.x/4.x methods engines may call. Written for hms-cache-proxy from the facts of the
// wire format: every field id, type and requiredness of the 2.3 part is checked against the
// classes in hive-metastore-2.3.10.jar by tests/rig/test_idl_matches_hive.py, and the 3.x/4.x
// part follows Hive 4.1's interface definition. Some 2.3 structs also carry the fields Hive 3
// and 4 added to them (Table, Partition, Database, GetTableRequest and others, each saying so),
// at their Hive 4.0.1 ids.
//
// The proxy forwards bytes, not objects: it decodes only the arguments a routing or cache
// decision needs, and never re-encodes a reply. Fields added by later Hive versions therefore
// pass through untouched even where this file does not list them.

include "fb303.thrift"

namespace py hms_cache_proxy.hive_metastore

const string DDL_TIME = "transient_lastDdlTime"

// ---------------------------------------------------------------------------------------------
// Enums

enum ClientCapability {
  TEST_CAPABILITY = 1,
  // Added in Hive 3; Trino sends it in get_table_req.
  INSERT_ONLY_TABLES = 2,
}

enum CompactionType {
  MINOR = 1,
  MAJOR = 2,
}

enum DataOperationType {
  SELECT = 1,
  INSERT = 2,
  UPDATE = 3,
  DELETE = 4,
  UNSET = 5,
  NO_TXN = 6,
}

enum EventRequestType {
  INSERT = 1,
  UPDATE = 2,
  DELETE = 3,
}

enum FileMetadataExprType {
  ORC_SARG = 1,
}

enum FunctionType {
  JAVA = 1,
}

enum GrantRevokeType {
  GRANT = 1,
  REVOKE = 2,
}

enum HiveObjectType {
  GLOBAL = 1,
  DATABASE = 2,
  TABLE = 3,
  PARTITION = 4,
  COLUMN = 5,
}

enum LockLevel {
  DB = 1,
  TABLE = 2,
  PARTITION = 3,
}

enum LockState {
  ACQUIRED = 1,
  WAITING = 2,
  ABORT = 3,
  NOT_ACQUIRED = 4,
}

enum LockType {
  SHARED_READ = 1,
  SHARED_WRITE = 2,
  EXCLUSIVE = 3,
}

enum PartitionEventType {
  LOAD_DONE = 1,
}

enum PrincipalType {
  USER = 1,
  ROLE = 2,
  GROUP = 3,
}

enum ResourceType {
  JAR = 1,
  FILE = 2,
  ARCHIVE = 3,
}

enum TxnState {
  COMMITTED = 1,
  ABORTED = 2,
  OPEN = 3,
}

// ---------------------------------------------------------------------------------------------
// Exceptions. Each carries one message; methods declare them at their own result field ids.

exception AlreadyExistsException { 1: string message }
exception ConfigValSecurityException { 1: string message }
exception IndexAlreadyExistsException { 1: string message }
exception InvalidInputException { 1: string message }
exception InvalidObjectException { 1: string message }
exception InvalidOperationException { 1: string message }
exception InvalidPartitionException { 1: string message }
exception MetaException { 1: string message }
exception NoSuchLockException { 1: string message }
exception NoSuchObjectException { 1: string message }
exception NoSuchTxnException { 1: string message }
exception TxnAbortedException { 1: string message }
exception TxnOpenException { 1: string message }
exception UnknownDBException { 1: string message }
exception UnknownPartitionException { 1: string message }
exception UnknownTableException { 1: string message }

// ---------------------------------------------------------------------------------------------
// Structs of Hive 2.3

struct AbortTxnRequest {
  1: required i64 txnid,
}

struct AbortTxnsRequest {
  1: required list<i64> txn_ids,
}

struct AddDynamicPartitions {
  1: required i64 txnid,
  2: required string dbname,
  3: required string tablename,
  4: required list<string> partitionnames,
  5: optional DataOperationType operationType,
}

struct SQLForeignKey {
  1: string pktable_db,
  2: string pktable_name,
  3: string pkcolumn_name,
  4: string fktable_db,
  5: string fktable_name,
  6: string fkcolumn_name,
  7: i32 key_seq,
  8: i32 update_rule,
  9: i32 delete_rule,
  10: string fk_name,
  11: string pk_name,
  12: bool enable_cstr,
  13: bool validate_cstr,
  14: bool rely_cstr,
}

struct AddForeignKeyRequest {
  1: required list<SQLForeignKey> foreignKeyCols,
}

struct FieldSchema {
  1: string name,
  2: string type,
  3: string comment,
}

struct SerDeInfo {
  1: string name,
  2: string serializationLib,
  3: map<string, string> parameters,
}

struct Order {
  1: string col,
  2: i32 order,
}

struct SkewedInfo {
  1: list<string> skewedColNames,
  2: list<list<string>> skewedColValues,
  3: map<list<string>, string> skewedColValueLocationMaps,
}

struct StorageDescriptor {
  1: list<FieldSchema> cols,
  2: string location,
  3: string inputFormat,
  4: string outputFormat,
  5: bool compressed,
  6: i32 numBuckets,
  7: SerDeInfo serdeInfo,
  8: list<string> bucketCols,
  9: list<Order> sortCols,
  10: map<string, string> parameters,
  11: optional SkewedInfo skewedInfo,
  12: optional bool storedAsSubDirectories,
}

struct PrivilegeGrantInfo {
  1: string privilege,
  2: i32 createTime,
  3: string grantor,
  4: PrincipalType grantorType,
  5: bool grantOption,
}

struct PrincipalPrivilegeSet {
  1: map<string, list<PrivilegeGrantInfo>> userPrivileges,
  2: map<string, list<PrivilegeGrantInfo>> groupPrivileges,
  3: map<string, list<PrivilegeGrantInfo>> rolePrivileges,
}

// Fields 10 to 13 are Hive 3/4's (Hive 4.0.1 ids); 9 is catName in 2.3.10 as in 3 and 4.
struct Partition {
  1: list<string> values,
  2: string dbName,
  3: string tableName,
  4: i32 createTime,
  5: i32 lastAccessTime,
  6: StorageDescriptor sd,
  7: map<string, string> parameters,
  8: optional PrincipalPrivilegeSet privileges,
  9: optional string catName,
  10: optional i64 writeId = -1,
  11: optional bool isStatsCompliant,
  12: optional ColumnStatistics colStats,
  13: optional FileMetadata fileMetadata,
}

struct AddPartitionsRequest {
  1: required string dbName,
  2: required string tblName,
  3: required list<Partition> parts,
  4: required bool ifNotExists,
  5: optional bool needResult,
  6: optional string catName,
}

struct AddPartitionsResult {
  1: optional list<Partition> partitions,
}

struct SQLPrimaryKey {
  1: string table_db,
  2: string table_name,
  3: string column_name,
  4: i32 key_seq,
  5: string pk_name,
  6: bool enable_cstr,
  7: bool validate_cstr,
  8: bool rely_cstr,
}

struct AddPrimaryKeyRequest {
  1: required list<SQLPrimaryKey> primaryKeyCols,
}

struct BooleanColumnStatsData {
  1: required i64 numTrues,
  2: required i64 numFalses,
  3: required i64 numNulls,
  4: optional string bitVectors,
}

struct LongColumnStatsData {
  1: optional i64 lowValue,
  2: optional i64 highValue,
  3: required i64 numNulls,
  4: required i64 numDVs,
  5: optional string bitVectors,
}

struct DoubleColumnStatsData {
  1: optional double lowValue,
  2: optional double highValue,
  3: required i64 numNulls,
  4: required i64 numDVs,
  5: optional string bitVectors,
}

struct StringColumnStatsData {
  1: required i64 maxColLen,
  2: required double avgColLen,
  3: required i64 numNulls,
  4: required i64 numDVs,
  5: optional string bitVectors,
}

struct BinaryColumnStatsData {
  1: required i64 maxColLen,
  2: required double avgColLen,
  3: required i64 numNulls,
  4: optional string bitVectors,
}

struct Decimal {
  1: required binary unscaled,
  3: required i16 scale,
}

struct DecimalColumnStatsData {
  1: optional Decimal lowValue,
  2: optional Decimal highValue,
  3: required i64 numNulls,
  4: required i64 numDVs,
  5: optional string bitVectors,
}

struct Date {
  1: required i64 daysSinceEpoch,
}

struct DateColumnStatsData {
  1: optional Date lowValue,
  2: optional Date highValue,
  3: required i64 numNulls,
  4: required i64 numDVs,
  5: optional string bitVectors,
}

struct ColumnStatisticsData {
  1: optional BooleanColumnStatsData booleanStats,
  2: optional LongColumnStatsData longStats,
  3: optional DoubleColumnStatsData doubleStats,
  4: optional StringColumnStatsData stringStats,
  5: optional BinaryColumnStatsData binaryStats,
  6: optional DecimalColumnStatsData decimalStats,
  7: optional DateColumnStatsData dateStats,
}

struct ColumnStatisticsObj {
  1: required string colName,
  2: required string colType,
  3: required ColumnStatisticsData statsData,
}

struct AggrStats {
  1: required list<ColumnStatisticsObj> colStats,
  2: required i64 partsFound,
}

struct CacheFileMetadataRequest {
  1: required string dbName,
  2: required string tblName,
  3: optional string partName,
  4: optional bool isAllParts,
}

struct CacheFileMetadataResult {
  1: required bool isSupported,
}

struct CheckLockRequest {
  1: required i64 lockid,
  2: optional i64 txnid,
  3: optional i64 elapsed_ms,
}

struct ClearFileMetadataRequest {
  1: required list<i64> fileIds,
}

struct ClearFileMetadataResult {}

struct ClientCapabilities {
  1: required list<ClientCapability> values,
}

struct ColumnStatisticsDesc {
  1: required bool isTblLevel,
  2: required string dbName,
  3: required string tableName,
  4: optional string partName,
  5: optional i64 lastAnalyzed,
  6: optional string catName,
}

struct ColumnStatistics {
  1: required ColumnStatisticsDesc statsDesc,
  2: required list<ColumnStatisticsObj> statsObj,
}

// Fields 2 to 7 are Hive 3/4's (Hive 4.0.1 ids). writeEventInfos (3) is set by replication,
// which commits the writes of a source transaction; ordinary commits leave it out.
struct CommitTxnRequest {
  1: required i64 txnid,
  2: optional string replPolicy,
  3: optional list<WriteEventInfo> writeEventInfos,
  4: optional ReplLastIdInfo replLastIdInfo,
  5: optional CommitTxnKeyValue keyValue,
  6: optional bool exclWriteEnabled = true,
  7: optional TxnType txn_type,
}

struct CompactionRequest {
  1: required string dbname,
  2: required string tablename,
  3: optional string partitionname,
  4: required CompactionType type,
  5: optional string runas,
  6: optional map<string, string> properties,
}

struct CompactionResponse {
  1: required i64 id,
  2: required string state,
  3: required bool accepted,
}

struct CurrentNotificationEventId {
  1: required i64 eventId,
}

// Fields 9 to 13 are Hive 3/4's (Hive 4.0.1 ids). A REMOTE database's tables are those of its
// data connector (12), with remote_dbname (13) the name of the database there.
struct Database {
  1: string name,
  2: string description,
  3: string locationUri,
  4: map<string, string> parameters,
  5: optional PrincipalPrivilegeSet privileges,
  6: optional string ownerName,
  7: optional PrincipalType ownerType,
  8: optional string catalogName,
  9: optional i32 createTime,
  10: optional string managedLocationUri,
  11: optional DatabaseType type,
  12: optional string connector_name,
  13: optional string remote_dbname,
}

struct DropConstraintRequest {
  1: required string dbname,
  2: required string tablename,
  3: required string constraintname,
}

struct DropPartitionsExpr {
  1: required binary expr,
  2: optional i32 partArchiveLevel,
}

struct RequestPartsSpec {
  1: optional list<string> names,
  2: optional list<DropPartitionsExpr> exprs,
}

struct EnvironmentContext {
  1: map<string, string> properties,
}

struct DropPartitionsRequest {
  1: required string dbName,
  2: required string tblName,
  3: required RequestPartsSpec parts,
  4: optional bool deleteData,
  5: optional bool ifExists,
  6: optional bool ignoreProtection,
  7: optional EnvironmentContext environmentContext,
  8: optional bool needResult,
  9: optional string catName,
}

struct DropPartitionsResult {
  1: optional list<Partition> partitions,
}

// Hive 3 renumbers this struct (1: replace, 2: filesAdded, ...); this is 2.3's form.
struct InsertEventRequestData {
  1: required list<string> filesAdded,
  2: optional list<string> filesAddedChecksum,
}

struct FireEventRequestData {
  1: optional InsertEventRequestData insertData,
}

struct FireEventRequest {
  1: required bool successful,
  2: required FireEventRequestData data,
  3: optional string dbName,
  4: optional string tableName,
  5: optional list<string> partitionVals,
}

struct FireEventResponse {}

struct ForeignKeysRequest {
  1: string parent_db_name,
  2: string parent_tbl_name,
  3: string foreign_db_name,
  4: string foreign_tbl_name,
}

struct ForeignKeysResponse {
  1: required list<SQLForeignKey> foreignKeys,
}

struct ResourceUri {
  1: ResourceType resourceType,
  2: string uri,
}

struct Function {
  1: string functionName,
  2: string dbName,
  3: string className,
  4: string ownerName,
  5: PrincipalType ownerType,
  6: i32 createTime,
  7: FunctionType functionType,
  8: list<ResourceUri> resourceUris,
  9: optional string catName,
}

struct GetAllFunctionsResponse {
  1: optional list<Function> functions,
}

struct GetFileMetadataByExprRequest {
  1: required list<i64> fileIds,
  2: required binary expr,
  3: optional bool doGetFooters,
  4: optional FileMetadataExprType type,
}

struct MetadataPpdResult {
  1: optional binary metadata,
  2: optional binary includeBitset,
}

struct GetFileMetadataByExprResult {
  1: required map<i64, MetadataPpdResult> metadata,
  2: required bool isSupported,
}

struct GetFileMetadataRequest {
  1: required list<i64> fileIds,
}

struct GetFileMetadataResult {
  1: required map<i64, binary> metadata,
  2: required bool isSupported,
}

struct TxnInfo {
  1: required i64 id,
  2: required TxnState state,
  3: required string user,
  4: required string hostname,
  5: optional string agentInfo,
  6: optional i32 heartbeatCount,
  7: optional string metaInfo,
  8: optional i64 startedTime,
  9: optional i64 lastHeartbeatTime,
}

struct GetOpenTxnsInfoResponse {
  1: required i64 txn_high_water_mark,
  2: required list<TxnInfo> open_txns,
}

struct GetOpenTxnsResponse {
  1: required i64 txn_high_water_mark,
  2: required set<i64> open_txns,
  3: optional i64 min_open_txn,
}

struct GetPrincipalsInRoleRequest {
  1: required string roleName,
}

struct RolePrincipalGrant {
  1: string roleName,
  2: string principalName,
  3: PrincipalType principalType,
  4: bool grantOption,
  5: i32 grantTime,
  6: string grantorName,
  7: PrincipalType grantorPrincipalType,
}

struct GetPrincipalsInRoleResponse {
  1: required list<RolePrincipalGrant> principalGrants,
}

struct GetRoleGrantsForPrincipalRequest {
  1: required string principal_name,
  2: required PrincipalType principal_type,
}

struct GetRoleGrantsForPrincipalResponse {
  1: required list<RolePrincipalGrant> principalGrants,
}

// Fields 4 and 6 to 11 are Hive 3/4's (Hive 4.0.1 ids; there is no field 5). Hive gives
// engine the default "hive" and id -1; they are left out here, so that a request the proxy
// builds itself carries only the fields it sets (the HMS assumes the same defaults).
struct GetTableRequest {
  1: required string dbName,
  2: required string tblName,
  3: optional ClientCapabilities capabilities,
  4: optional string catName,
  6: optional string validWriteIdList,
  7: optional bool getColumnStats,
  8: optional list<string> processorCapabilities,
  9: optional string processorIdentifier,
  10: optional string engine,
  11: optional i64 id,
}

// Fields 16 to 28 are Hive 3/4's, at their Hive 4.0.1 ids. Hive 2.3.10 alone has catName at
// 16, a string; from Hive 3 on field 16 is the creationMetadata struct and catName is 17, and
// that is what a 3/4 client or server sends. A 2.3.10 Table's string at 16 then has another
// wire type than declared here, which the decoder skips (see proxy.conform): it decodes with
// no catName, and nothing of it is lost on the wire, where the proxy keeps the bytes.
struct Table {
  1: string tableName,
  2: string dbName,
  3: string owner,
  4: i32 createTime,
  5: i32 lastAccessTime,
  6: i32 retention,
  7: StorageDescriptor sd,
  8: list<FieldSchema> partitionKeys,
  9: map<string, string> parameters,
  10: string viewOriginalText,
  11: string viewExpandedText,
  12: string tableType,
  13: optional PrincipalPrivilegeSet privileges,
  14: optional bool temporary,
  15: optional bool rewriteEnabled,
  16: optional CreationMetadata creationMetadata,
  17: optional string catName,
  18: optional PrincipalType ownerType = PrincipalType.USER,
  19: optional i64 writeId = -1,
  20: optional bool isStatsCompliant,
  21: optional ColumnStatistics colStats,
  22: optional byte accessType,
  23: optional list<string> requiredReadCapabilities,
  24: optional list<string> requiredWriteCapabilities,
  25: optional i64 id,
  26: optional FileMetadata fileMetadata,
  27: optional ObjectDictionary dictionary,
  28: optional i64 txnId,
}

struct GetTableResult {
  1: required Table table,
  2: optional bool isStatsCompliant,
}

// Fields 4 to 8 are Hive 3/4's (Hive 4.0.1 ids).
struct GetTablesRequest {
  1: required string dbName,
  2: optional list<string> tblNames,
  3: optional ClientCapabilities capabilities,
  4: optional string catName,
  5: optional list<string> processorCapabilities,
  6: optional string processorIdentifier,
  7: optional GetProjectionsSpec projectionSpec,
  8: optional string tablesPattern,
}

struct GetTablesResult {
  1: required list<Table> tables,
}

struct HiveObjectRef {
  1: HiveObjectType objectType,
  2: string dbName,
  3: string objectName,
  4: list<string> partValues,
  5: string columnName,
  6: optional string catName,
}

struct HiveObjectPrivilege {
  1: HiveObjectRef hiveObject,
  2: string principalName,
  3: PrincipalType principalType,
  4: PrivilegeGrantInfo grantInfo,
}

struct PrivilegeBag {
  1: list<HiveObjectPrivilege> privileges,
}

struct GrantRevokePrivilegeRequest {
  1: GrantRevokeType requestType,
  2: PrivilegeBag privileges,
  3: optional bool revokeGrantOption,
}

struct GrantRevokePrivilegeResponse {
  1: optional bool success,
}

struct GrantRevokeRoleRequest {
  1: GrantRevokeType requestType,
  2: string roleName,
  3: string principalName,
  4: PrincipalType principalType,
  5: optional string grantor,
  6: optional PrincipalType grantorType,
  7: optional bool grantOption,
}

struct GrantRevokeRoleResponse {
  1: optional bool success,
}

struct HeartbeatRequest {
  1: optional i64 lockid,
  2: optional i64 txnid,
}

struct HeartbeatTxnRangeRequest {
  1: required i64 min,
  2: required i64 max,
}

struct HeartbeatTxnRangeResponse {
  1: required set<i64> aborted,
  2: required set<i64> nosuch,
}

struct Index {
  1: string indexName,
  2: string indexHandlerClass,
  3: string dbName,
  4: string origTableName,
  5: i32 createTime,
  6: i32 lastAccessTime,
  7: string indexTableName,
  8: StorageDescriptor sd,
  9: map<string, string> parameters,
  10: bool deferredRebuild,
}

struct LockComponent {
  1: required LockType type,
  2: required LockLevel level,
  3: required string dbname,
  4: optional string tablename,
  5: optional string partitionname,
  6: optional DataOperationType operationType,
  7: optional bool isAcid,
  8: optional bool isDynamicPartitionWrite,
}

struct LockRequest {
  1: required list<LockComponent> component,
  2: optional i64 txnid,
  3: required string user,
  4: required string hostname,
  5: optional string agentInfo,
}

struct LockResponse {
  1: required i64 lockid,
  2: required LockState state,
}

struct NotificationEvent {
  1: required i64 eventId,
  2: required i32 eventTime,
  3: required string eventType,
  4: optional string dbName,
  5: optional string tableName,
  6: required string message,
  7: optional string messageFormat,
}

struct NotificationEventRequest {
  1: required i64 lastEvent,
  2: optional i32 maxEvents,
}

struct NotificationEventResponse {
  1: required list<NotificationEvent> events,
}

struct OpenTxnRequest {
  1: required i32 num_txns,
  2: required string user,
  3: required string hostname,
  4: optional string agentInfo,
}

struct OpenTxnsResponse {
  1: required list<i64> txn_ids,
}

struct PartitionListComposingSpec {
  1: list<Partition> partitions,
}

struct PartitionWithoutSD {
  1: list<string> values,
  2: i32 createTime,
  3: i32 lastAccessTime,
  4: string relativePath,
  5: map<string, string> parameters,
  6: optional PrincipalPrivilegeSet privileges,
}

struct PartitionSpecWithSharedSD {
  1: list<PartitionWithoutSD> partitions,
  2: StorageDescriptor sd,
}

struct PartitionSpec {
  1: string dbName,
  2: string tableName,
  3: string rootPath,
  4: optional PartitionSpecWithSharedSD sharedSDPartitionSpec,
  5: optional PartitionListComposingSpec partitionList,
  6: optional string catName,
}

struct PartitionValuesRequest {
  1: required string dbName,
  2: required string tblName,
  3: required list<FieldSchema> partitionKeys,
  4: optional bool applyDistinct,
  5: optional string filter,
  6: optional list<FieldSchema> partitionOrder,
  7: optional bool ascending,
  8: optional i64 maxParts,
  9: optional string catName,
}

struct PartitionValuesRow {
  1: required list<string> row,
}

struct PartitionValuesResponse {
  1: required list<PartitionValuesRow> partitionValues,
}

struct PartitionsByExprRequest {
  1: required string dbName,
  2: required string tblName,
  3: required binary expr,
  4: optional string defaultPartitionName,
  5: optional i16 maxParts,
  6: optional string catName,
}

struct PartitionsByExprResult {
  1: required list<Partition> partitions,
  2: required bool hasUnknownPartitions,
}

struct PartitionsStatsRequest {
  1: required string dbName,
  2: required string tblName,
  3: required list<string> colNames,
  4: required list<string> partNames,
  5: optional string catName,
}

struct PartitionsStatsResult {
  1: required map<string, list<ColumnStatisticsObj>> partStats,
}

struct PrimaryKeysRequest {
  1: required string db_name,
  2: required string tbl_name,
}

struct PrimaryKeysResponse {
  1: required list<SQLPrimaryKey> primaryKeys,
}

struct PutFileMetadataRequest {
  1: required list<i64> fileIds,
  2: required list<binary> metadata,
  3: optional FileMetadataExprType type,
}

struct PutFileMetadataResult {}

struct Role {
  1: string roleName,
  2: i32 createTime,
  3: string ownerName,
}

struct Schema {
  1: list<FieldSchema> fieldSchemas,
  2: map<string, string> properties,
}

struct SetPartitionsStatsRequest {
  1: required list<ColumnStatistics> colStats,
  2: optional bool needMerge,
}

struct ShowCompactRequest {}

struct ShowCompactResponseElement {
  1: required string dbname,
  2: required string tablename,
  3: optional string partitionname,
  4: required CompactionType type,
  5: required string state,
  6: optional string workerid,
  7: optional i64 start,
  8: optional string runAs,
  9: optional i64 hightestTxnId,
  10: optional string metaInfo,
  11: optional i64 endTime,
  12: optional string hadoopJobId,
  13: optional i64 id,
}

struct ShowCompactResponse {
  1: required list<ShowCompactResponseElement> compacts,
}

struct ShowLocksRequest {
  1: optional string dbname,
  2: optional string tablename,
  3: optional string partname,
  4: optional bool isExtended,
}

struct ShowLocksResponseElement {
  1: required i64 lockid,
  2: required string dbname,
  3: optional string tablename,
  4: optional string partname,
  5: required LockState state,
  6: required LockType type,
  7: optional i64 txnid,
  8: required i64 lastheartbeat,
  9: optional i64 acquiredat,
  10: required string user,
  11: required string hostname,
  12: optional i32 heartbeatCount,
  13: optional string agentInfo,
  14: optional i64 blockedByExtId,
  15: optional i64 blockedByIntId,
  16: optional i64 lockIdInternal,
}

struct ShowLocksResponse {
  1: list<ShowLocksResponseElement> locks,
}

struct TableMeta {
  1: required string dbName,
  2: required string tableName,
  3: required string tableType,
  4: optional string comments,
}

struct TableStatsRequest {
  1: required string dbName,
  2: required string tblName,
  3: required list<string> colNames,
}

struct TableStatsResult {
  1: required list<ColumnStatisticsObj> tableStats,
}

struct Type {
  1: string name,
  2: optional string type1,
  3: optional string type2,
  4: optional list<FieldSchema> fields,
}

struct UnlockRequest {
  1: required i64 lockid,
}

struct Version {
  1: string version,
  2: string comments,
}

// =============================================================================================
// Hive 3.x and 4.x additions. Methods that Hive 2.3 does not have, and the request and response
// structs they use, as in Hive 4.1's IDL. A 2.3 server answers these with UNKNOWN_METHOD, which
// the proxy passes through so that clients fall back. The proxy decodes only the database,
// table and partition fields of these requests; structs it never decodes are declared with
// the fields that matter for that, plus an explanation where fields were left out.
// =============================================================================================

enum DatabaseType {
  NATIVE = 1,
  REMOTE = 2,
}

enum PartitionFilterMode {
  BY_NAMES,
  BY_VALUES,
  BY_EXPR,
}

enum TxnType {
  DEFAULT = 0,
  REPL_CREATED = 1,
  READ_ONLY = 2,
  COMPACTION = 3,
  MATER_VIEW_REBUILD = 4,
  SOFT_DELETE = 5,
  REBALANCE_COMPACTION = 6,
}

struct Catalog {
  1: string name,
  2: optional string description,
  3: string locationUri,
  4: optional i32 createTime,
}

struct GetCatalogRequest { 1: string name }
struct GetCatalogResponse { 1: Catalog catalog }
struct GetCatalogsResponse { 1: list<string> names }
struct CreateCatalogRequest { 1: Catalog catalog }
struct AlterCatalogRequest { 1: string name, 2: Catalog newCat }
struct DropCatalogRequest { 1: string name }

struct GetDatabaseRequest {
  1: optional string name,
  2: optional string catalogName,
  3: optional list<string> processorCapabilities,
  4: optional string processorIdentifier,
}

struct CreateDatabaseRequest {
  1: required string databaseName,
  2: optional string description,
  3: optional string locationUri,
  4: optional map<string, string> parameters,
  5: optional PrincipalPrivilegeSet privileges,
  6: optional string ownerName,
  7: optional PrincipalType ownerType,
  8: optional string catalogName,
  9: optional i32 createTime,
  10: optional string managedLocationUri,
  11: optional DatabaseType type,
  12: optional string dataConnectorName,
  13: optional string remote_dbname,
}

struct AlterDatabaseRequest {
  1: required string oldDbName,
  2: required Database newDb,
}

struct DropDatabaseRequest {
  1: required string name,
  2: optional string catalogName,
  3: required bool ignoreUnknownDb,
  4: required bool deleteData,
  5: required bool cascade,
  6: optional bool softDelete = false,
  7: optional i64 txnId = 0,
  8: optional bool deleteManagedDir = true,
}

struct GetDatabaseObjectsRequest {
  1: optional string catalogName,
  2: optional string pattern,
}

struct GetDatabaseObjectsResponse { 1: required list<Database> databases }

// Constraints beyond the 2.3 primary and foreign keys. Field 1 is the catalog in every one.
struct SQLUniqueConstraint {
  1: string catName,
  2: string table_db,
  3: string table_name,
  4: string column_name,
  5: i32 key_seq,
  6: string uk_name,
  7: bool enable_cstr,
  8: bool validate_cstr,
  9: bool rely_cstr,
}

struct SQLNotNullConstraint {
  1: string catName,
  2: string table_db,
  3: string table_name,
  4: string column_name,
  5: string nn_name,
  6: bool enable_cstr,
  7: bool validate_cstr,
  8: bool rely_cstr,
}

struct SQLDefaultConstraint {
  1: string catName,
  2: string table_db,
  3: string table_name,
  4: string column_name,
  5: string default_value,
  6: string dc_name,
  7: bool enable_cstr,
  8: bool validate_cstr,
  9: bool rely_cstr,
}

struct SQLCheckConstraint {
  1: string catName,
  2: string table_db,
  3: string table_name,
  4: string column_name,
  5: string check_expression,
  6: string dc_name,
  7: bool enable_cstr,
  8: bool validate_cstr,
  9: bool rely_cstr,
}

struct UniqueConstraintsRequest {
  1: required string catName,
  2: required string db_name,
  3: required string tbl_name,
  4: optional string validWriteIdList,
  5: optional i64 tableId = -1,
}
struct UniqueConstraintsResponse { 1: required list<SQLUniqueConstraint> uniqueConstraints }

struct NotNullConstraintsRequest {
  1: required string catName,
  2: required string db_name,
  3: required string tbl_name,
  4: optional string validWriteIdList,
  5: optional i64 tableId = -1,
}
struct NotNullConstraintsResponse { 1: required list<SQLNotNullConstraint> notNullConstraints }

struct DefaultConstraintsRequest {
  1: required string catName,
  2: required string db_name,
  3: required string tbl_name,
  4: optional string validWriteIdList,
  5: optional i64 tableId = -1,
}
struct DefaultConstraintsResponse { 1: required list<SQLDefaultConstraint> defaultConstraints }

struct CheckConstraintsRequest {
  1: required string catName,
  2: required string db_name,
  3: required string tbl_name,
  4: optional string validWriteIdList,
  5: optional i64 tableId = -1,
}
struct CheckConstraintsResponse { 1: required list<SQLCheckConstraint> checkConstraints }

struct AllTableConstraintsRequest {
  1: required string dbName,
  2: required string tblName,
  3: required string catName,
  4: optional string validWriteIdList,
  5: optional i64 tableId = -1,
}

struct SQLAllTableConstraints {
  1: optional list<SQLPrimaryKey> primaryKeys,
  2: optional list<SQLForeignKey> foreignKeys,
  3: optional list<SQLUniqueConstraint> uniqueConstraints,
  4: optional list<SQLNotNullConstraint> notNullConstraints,
  5: optional list<SQLDefaultConstraint> defaultConstraints,
  6: optional list<SQLCheckConstraint> checkConstraints,
}
struct AllTableConstraintsResponse { 1: required SQLAllTableConstraints allTableConstraints }

struct AddUniqueConstraintRequest { 1: required list<SQLUniqueConstraint> uniqueConstraintCols }
struct AddNotNullConstraintRequest { 1: required list<SQLNotNullConstraint> notNullConstraintCols }
struct AddDefaultConstraintRequest { 1: required list<SQLDefaultConstraint> defaultConstraintCols }
struct AddCheckConstraintRequest { 1: required list<SQLCheckConstraint> checkConstraintCols }

// Tables.

// What a materialized view was built from (Table.16).
struct CreationMetadata {
  1: required string catName,
  2: required string dbName,
  3: required string tblName,
  4: required set<string> tablesUsed,
  5: optional string validTxnList,
  6: optional i64 materializationTime,
  7: optional list<SourceTable> sourceTables,
}

struct SourceTable {
  1: required Table table,
  2: required i64 insertedCount,
  3: required i64 updatedCount,
  4: required i64 deletedCount,
}

// Serialized file metadata of a table or partition, for engines that ask for it (Table.26,
// Partition.13); type 1 is Impala's.
struct FileMetadata {
  1: byte type = 1,
  2: byte version = 1,
  3: list<binary> data,
}

struct CreateTableRequest {
  1: required Table table,
  2: optional EnvironmentContext envContext,
  3: optional list<SQLPrimaryKey> primaryKeys,
  4: optional list<SQLForeignKey> foreignKeys,
  5: optional list<SQLUniqueConstraint> uniqueConstraints,
  6: optional list<SQLNotNullConstraint> notNullConstraints,
  7: optional list<SQLDefaultConstraint> defaultConstraints,
  8: optional list<SQLCheckConstraint> checkConstraints,
  9: optional list<string> processorCapabilities,
  10: optional string processorIdentifier,
}

// Field 7 has meant two things across 4.x releases (indexName, later id); it is left out.
struct DropTableRequest {
  1: optional string catalogName,
  2: required string dbName,
  3: required string tableName,
  4: optional bool deleteData,
  5: optional EnvironmentContext envContext,
  6: optional bool dropPartitions,
}

struct TruncateTableRequest {
  1: required string dbName,
  2: required string tableName,
  3: optional list<string> partNames,
  4: optional i64 writeId = -1,
  5: optional string validWriteIdList,
  6: optional EnvironmentContext environmentContext,
}
struct TruncateTableResponse {}

struct AlterTableRequest {
  1: optional string catName,
  2: required string dbName,
  3: required string tableName,
  4: required Table table,
  5: optional EnvironmentContext environmentContext,
  6: optional i64 writeId = -1,
  7: optional string validWriteIdList,
  8: optional list<string> processorCapabilities,
  9: optional string processorIdentifier,
  10: optional string expectedParameterKey,
  11: optional string expectedParameterValue,
}
struct AlterTableResponse {}

struct GetTablesExtRequest {
  1: required string catalog,
  2: required string database,
  3: required string tableNamePattern,
  4: required i32 requestedFields,
  5: optional i32 limit,
  6: optional list<string> processorCapabilities,
  7: optional string processorIdentifier,
}

struct ExtendedTableInfo {
  1: required string tblName,
  2: optional i32 accessType,
  3: optional list<string> requiredReadCapabilities,
  4: optional list<string> requiredWriteCapabilities,
}

struct GetFieldsRequest {
  1: optional string catName,
  2: required string dbName,
  3: required string tblName,
  4: optional EnvironmentContext envContext,
  5: optional string validWriteIdList,
  6: optional i64 id = -1,
}
struct GetFieldsResponse { 1: required list<FieldSchema> fields }

struct GetSchemaRequest {
  1: optional string catName,
  2: required string dbName,
  3: required string tblName,
  4: optional EnvironmentContext envContext,
  5: optional string validWriteIdList,
  6: optional i64 id = -1,
}
struct GetSchemaResponse { 1: required list<FieldSchema> fields }

// Partitions.
struct GetPartitionRequest {
  1: optional string catName,
  2: required string dbName,
  3: required string tblName,
  4: required list<string> partVals,
  5: optional string validWriteIdList,
  6: optional i64 id = -1,
}
struct GetPartitionResponse { 1: required Partition partition }

struct PartitionsRequest {
  1: optional string catName,
  2: required string dbName,
  3: required string tblName,
  4: optional i16 maxParts = -1,
  5: optional string validWriteIdList,
  6: optional i64 id = -1,
  7: optional bool skipColumnSchemaForPartition,
  8: optional string includeParamKeyPattern,
  9: optional string excludeParamKeyPattern,
}
struct PartitionsResponse { 1: required list<Partition> partitions }

struct GetPartitionsByNamesRequest {
  1: required string db_name,
  2: required string tbl_name,
  3: optional list<string> names,
  4: optional bool get_col_stats,
  5: optional list<string> processorCapabilities,
  6: optional string processorIdentifier,
  7: optional string engine = "hive",
  8: optional string validWriteIdList,
  9: optional bool getFileMetadata,
  10: optional i64 id = -1,
  11: optional bool skipColumnSchemaForPartition,
  12: optional string includeParamKeyPattern,
  13: optional string excludeParamKeyPattern,
}

// Values shared by the partitions of one reply, referred to by index (Table.27 too).
struct ObjectDictionary { 1: required map<string, list<binary>> values }

struct GetPartitionsByNamesResult {
  1: required list<Partition> partitions,
  2: optional ObjectDictionary dictionary,
}

struct GetPartitionNamesPsRequest {
  1: optional string catName,
  2: required string dbName,
  3: required string tblName,
  4: optional list<string> partValues,
  5: optional i16 maxParts = -1,
  6: optional string validWriteIdList,
  7: optional i64 id = -1,
}
struct GetPartitionNamesPsResponse { 1: required list<string> names }

struct GetPartitionsPsWithAuthRequest {
  1: optional string catName,
  2: required string dbName,
  3: required string tblName,
  4: optional list<string> partVals,
  5: optional i16 maxParts = -1,
  6: optional string userName,
  7: optional list<string> groupNames,
  8: optional string validWriteIdList,
  9: optional i64 id = -1,
  10: optional bool skipColumnSchemaForPartition,
  11: optional string includeParamKeyPattern,
  12: optional string excludeParamKeyPattern,
  13: optional list<string> partNames,
}
struct GetPartitionsPsWithAuthResponse { 1: required list<Partition> partitions }

struct GetPartitionsByFilterRequest {
  1: optional string catName,
  2: string dbName,
  3: string tblName,
  4: string filter,
  5: optional i16 maxParts = -1,
  6: optional bool skipColumnSchemaForPartition,
  7: optional string includeParamKeyPattern,
  8: optional string excludeParamKeyPattern,
}

struct GetProjectionsSpec {
  1: list<string> fieldList,
  2: string includeParamKeyPattern,
  3: string excludeParamKeyPattern,
}

struct GetPartitionsFilterSpec {
  7: optional PartitionFilterMode filterMode,
  8: optional list<string> filters,
}

struct GetPartitionsRequest {
  1: optional string catName,
  2: string dbName,
  3: string tblName,
  4: optional bool withAuth,
  5: optional string user,
  6: optional list<string> groupNames,
  7: GetProjectionsSpec projectionSpec,
  8: GetPartitionsFilterSpec filterSpec,
  9: optional list<string> processorCapabilities,
  10: optional string processorIdentifier,
  11: optional string validWriteIdList,
}
struct GetPartitionsResponse { 1: list<PartitionSpec> partitionSpec }

struct PartitionsSpecByExprResult {
  1: required list<PartitionSpec> partitionsSpec,
  2: required bool hasUnknownPartitions,
}

struct RenamePartitionRequest {
  1: optional string catName,
  2: required string dbName,
  3: required string tableName,
  4: required list<string> partVals,
  5: required Partition newPart,
  6: optional string validWriteIdList,
  7: optional i64 txnId,
  8: optional bool clonePart,
}
struct RenamePartitionResponse {}

struct AppendPartitionsRequest {
  1: optional string catalogName,
  2: required string dbName,
  3: required string tableName,
  4: optional string name,
  5: optional list<string> partVals,
  6: optional EnvironmentContext environmentContext,
}

struct DropPartitionRequest {
  1: optional string catName,
  2: required string dbName,
  3: required string tblName,
  4: optional string partName,
  5: optional list<string> partVals,
  6: optional bool deleteData,
  7: optional EnvironmentContext environmentContext,
}

struct AlterPartitionsRequest {
  1: optional string catName,
  2: required string dbName,
  3: required string tableName,
  4: required list<Partition> partitions,
  5: optional EnvironmentContext environmentContext,
  6: optional i64 writeId = -1,
  7: optional string validWriteIdList,
  8: optional bool skipColumnSchemaForPartition,
  9: optional list<FieldSchema> partitionColSchema,
}
struct AlterPartitionsResponse {}

// Statistics.
struct SetPartitionsStatsResponse { 1: required bool result }

struct DeleteColumnStatisticsRequest {
  1: optional string cat_name,
  2: required string db_name,
  3: required string tbl_name,
  4: optional list<string> part_names,
  5: optional list<string> col_names,
  6: optional string engine = "hive",
  7: optional bool tableLevel = false,
}

// Transactions and the notification log.
struct GetValidWriteIdsRequest {
  1: required list<string> fullTableNames,
  2: optional string validTxnList,
  3: optional i64 writeId,
}

struct TableValidWriteIds {
  1: required string fullTableName,
  2: required i64 writeIdHighWaterMark,
  3: required list<i64> invalidWriteIds,
  4: optional i64 minOpenWriteId,
  5: required binary abortedBits,
}
struct GetValidWriteIdsResponse { 1: required list<TableValidWriteIds> tblValidWriteIds }

struct TxnToWriteId {
  1: required i64 txnId,
  2: required i64 writeId,
}

struct AllocateTableWriteIdsRequest {
  1: required string dbName,
  2: required string tableName,
  3: optional list<i64> txnIds,
  4: optional string replPolicy,
  5: optional list<TxnToWriteId> srcTxnToWriteIdList,
  6: optional bool reallocate = false,
}
struct AllocateTableWriteIdsResponse { 1: required list<TxnToWriteId> txnToWriteIds }

struct NotificationEventsCountRequest {
  1: required i64 fromEventId,
  2: required string dbName,
  3: optional string catName,
  4: optional i64 toEventId,
  5: optional i64 limit,
  6: optional list<string> tableNames,
}
struct NotificationEventsCountResponse { 1: required i64 eventsCount }

struct GetAllWriteEventInfoRequest {
  1: required i64 txnId,
  2: optional string dbName,
  3: optional string tableName,
}

struct WriteEventInfo {
  1: required i64 writeId,
  2: required string database,
  3: required string table,
  4: required string files,
  5: optional string partition,
  6: optional string tableObj,
  7: optional string partitionObj,
}

struct WriteNotificationLogRequest {
  1: required i64 txnId,
  2: required i64 writeId,
  3: required string db,
  4: required string table,
  5: required InsertEventRequestData fileInfo,
  6: optional list<string> partitionVals,
}
struct WriteNotificationLogResponse {}

struct WriteNotificationLogBatchRequest {
  1: required string catalog,
  2: required string db,
  3: required string table,
  4: required list<WriteNotificationLogRequest> requestList,
}
struct WriteNotificationLogBatchResponse {}

struct ReplLastIdInfo {
  1: required string database,
  2: required i64 lastReplId,
  3: optional string table,
  4: optional string catalog,
  5: optional list<string> partitionList,
}

struct CommitTxnKeyValue {
  1: required i64 tableId,
  2: required string key,
  3: required string value,
}

// Functions (4.2).
struct GetFunctionsRequest {
  1: required string dbName,
  2: optional string catalogName,
  3: optional string pattern,
  4: optional bool returnNames = true,
}

struct GetFunctionsResponse {
  1: optional list<string> function_names,
  2: optional list<Function> functions,
}

// ---------------------------------------------------------------------------------------------
// The service. Method names are bare on the wire (no multiplexing).

service ThriftHiveMetastore extends fb303.FacebookService {
  // --- Session and server ---

  void flushCache()
  string getMetaConf(1: string key)
      throws (1: MetaException o1)
  string get_config_value(1: string name, 2: string defaultValue)
      throws (1: ConfigValSecurityException o1)
  bool partition_name_has_valid_characters(1: list<string> part_vals, 2: bool throw_exception)
      throws (1: MetaException o1)
  map<string, string> partition_name_to_spec(1: string part_name)
      throws (1: MetaException o1)
  list<string> partition_name_to_vals(1: string part_name)
      throws (1: MetaException o1)
  void setMetaConf(1: string key, 2: string value)
      throws (1: MetaException o1)
  list<string> set_ugi(1: string user_name, 2: list<string> group_names)
      throws (1: MetaException o1)

  // --- Delegation tokens and master keys ---

  i32 add_master_key(1: string key)
      throws (1: MetaException o1)
  bool add_token(1: string token_identifier, 2: string delegation_token)
  void cancel_delegation_token(1: string token_str_form)
      throws (1: MetaException o1)
  list<string> get_all_token_identifiers()
  string get_delegation_token(1: string token_owner, 2: string renewer_kerberos_principal_name)
      throws (1: MetaException o1)
  list<string> get_master_keys()
  string get_token(1: string token_identifier)
  bool remove_master_key(1: i32 key_seq)
  bool remove_token(1: string token_identifier)
  i64 renew_delegation_token(1: string token_str_form)
      throws (1: MetaException o1)
  void update_master_key(1: i32 seq_number, 2: string key)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)

  // --- Notification log ---

  FireEventResponse fire_listener_event(1: FireEventRequest rqst)
  CurrentNotificationEventId get_current_notificationEventId()
  NotificationEventResponse get_next_notification(1: NotificationEventRequest rqst)

  // --- Transactions, locks and compaction ---

  void abort_txn(1: AbortTxnRequest rqst)
      throws (1: NoSuchTxnException o1)
  void abort_txns(1: AbortTxnsRequest rqst)
      throws (1: NoSuchTxnException o1)
  void add_dynamic_partitions(1: AddDynamicPartitions rqst)
      throws (1: NoSuchTxnException o1, 2: TxnAbortedException o2)
  LockResponse check_lock(1: CheckLockRequest rqst)
      throws (1: NoSuchTxnException o1, 2: TxnAbortedException o2, 3: NoSuchLockException o3)
  void commit_txn(1: CommitTxnRequest rqst)
      throws (1: NoSuchTxnException o1, 2: TxnAbortedException o2)
  void compact(1: CompactionRequest rqst)
  CompactionResponse compact2(1: CompactionRequest rqst)
  GetOpenTxnsResponse get_open_txns()
  GetOpenTxnsInfoResponse get_open_txns_info()
  void heartbeat(1: HeartbeatRequest ids)
      throws (1: NoSuchLockException o1, 2: NoSuchTxnException o2, 3: TxnAbortedException o3)
  HeartbeatTxnRangeResponse heartbeat_txn_range(1: HeartbeatTxnRangeRequest txns)
  LockResponse lock(1: LockRequest rqst)
      throws (1: NoSuchTxnException o1, 2: TxnAbortedException o2)
  OpenTxnsResponse open_txns(1: OpenTxnRequest rqst)
  ShowCompactResponse show_compact(1: ShowCompactRequest rqst)
  ShowLocksResponse show_locks(1: ShowLocksRequest rqst)
  void unlock(1: UnlockRequest rqst)
      throws (1: NoSuchLockException o1, 2: TxnOpenException o2)

  // --- Privileges and roles ---

  bool create_role(1: Role role)
      throws (1: MetaException o1)
  bool drop_role(1: string role_name)
      throws (1: MetaException o1)
  GetPrincipalsInRoleResponse get_principals_in_role(1: GetPrincipalsInRoleRequest request)
      throws (1: MetaException o1)
  PrincipalPrivilegeSet get_privilege_set(1: HiveObjectRef hiveObject, 2: string user_name, 3: list<string> group_names)
      throws (1: MetaException o1)
  GetRoleGrantsForPrincipalResponse get_role_grants_for_principal(1: GetRoleGrantsForPrincipalRequest request)
      throws (1: MetaException o1)
  list<string> get_role_names()
      throws (1: MetaException o1)
  bool grant_privileges(1: PrivilegeBag privileges)
      throws (1: MetaException o1)
  GrantRevokePrivilegeResponse grant_revoke_privileges(1: GrantRevokePrivilegeRequest request)
      throws (1: MetaException o1)
  GrantRevokeRoleResponse grant_revoke_role(1: GrantRevokeRoleRequest request)
      throws (1: MetaException o1)
  bool grant_role(1: string role_name, 2: string principal_name, 3: PrincipalType principal_type, 4: string grantor, 5: PrincipalType grantorType, 6: bool grant_option)
      throws (1: MetaException o1)
  list<HiveObjectPrivilege> list_privileges(1: string principal_name, 2: PrincipalType principal_type, 3: HiveObjectRef hiveObject)
      throws (1: MetaException o1)
  list<Role> list_roles(1: string principal_name, 2: PrincipalType principal_type)
      throws (1: MetaException o1)
  bool revoke_privileges(1: PrivilegeBag privileges)
      throws (1: MetaException o1)
  bool revoke_role(1: string role_name, 2: string principal_name, 3: PrincipalType principal_type)
      throws (1: MetaException o1)

  // --- Functions ---

  void alter_function(1: string dbName, 2: string funcName, 3: Function newFunc)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  void create_function(1: Function func)
      throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3, 4: NoSuchObjectException o4)
  void drop_function(1: string dbName, 2: string funcName)
      throws (1: NoSuchObjectException o1, 2: MetaException o3)
  GetAllFunctionsResponse get_all_functions()
      throws (1: MetaException o1)
  Function get_function(1: string dbName, 2: string funcName)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<string> get_functions(1: string dbName, 2: string pattern)
      throws (1: MetaException o1)

  // --- File metadata ---

  CacheFileMetadataResult cache_file_metadata(1: CacheFileMetadataRequest req)
  ClearFileMetadataResult clear_file_metadata(1: ClearFileMetadataRequest req)
  GetFileMetadataResult get_file_metadata(1: GetFileMetadataRequest req)
  GetFileMetadataByExprResult get_file_metadata_by_expr(1: GetFileMetadataByExprRequest req)
  PutFileMetadataResult put_file_metadata(1: PutFileMetadataRequest req)

  // --- Indexes (removed in Hive 3.0) ---

  Index add_index(1: Index new_index, 2: Table index_table)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  void alter_index(1: string dbname, 2: string base_tbl_name, 3: string idx_name, 4: Index new_idx)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  bool drop_index_by_name(1: string db_name, 2: string tbl_name, 3: string index_name, 4: bool deleteData)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  Index get_index_by_name(1: string db_name, 2: string tbl_name, 3: string index_name)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<string> get_index_names(1: string db_name, 2: string tbl_name, 3: i16 max_indexes)
      throws (1: MetaException o2)
  list<Index> get_indexes(1: string db_name, 2: string tbl_name, 3: i16 max_indexes)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)

  // --- Types ---

  bool create_type(1: Type type)
      throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3)
  bool drop_type(1: string type)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<string> get_tables_by_type(1: string db_name, 2: string pattern, 3: string tableType)
      throws (1: MetaException o1)
  Type get_type(1: string name)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  map<string, Type> get_type_all(1: string name)
      throws (1: MetaException o2)

  // --- Constraints ---

  void add_foreign_key(1: AddForeignKeyRequest req)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  void add_primary_key(1: AddPrimaryKeyRequest req)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  void create_table_with_constraints(1: Table tbl, 2: list<SQLPrimaryKey> primaryKeys, 3: list<SQLForeignKey> foreignKeys)
      throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3, 4: NoSuchObjectException o4)
  void drop_constraint(1: DropConstraintRequest req)
      throws (1: NoSuchObjectException o1, 2: MetaException o3)
  ForeignKeysResponse get_foreign_keys(1: ForeignKeysRequest request)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  PrimaryKeysResponse get_primary_keys(1: PrimaryKeysRequest request)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)

  // --- Column statistics ---

  bool delete_partition_column_statistics(1: string db_name, 2: string tbl_name, 3: string part_name, 4: string col_name)
      throws (1: NoSuchObjectException o1, 2: MetaException o2, 3: InvalidObjectException o3, 4: InvalidInputException o4)
  bool delete_table_column_statistics(1: string db_name, 2: string tbl_name, 3: string col_name)
      throws (1: NoSuchObjectException o1, 2: MetaException o2, 3: InvalidObjectException o3, 4: InvalidInputException o4)
  AggrStats get_aggr_stats_for(1: PartitionsStatsRequest request)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  ColumnStatistics get_partition_column_statistics(1: string db_name, 2: string tbl_name, 3: string part_name, 4: string col_name)
      throws (1: NoSuchObjectException o1, 2: MetaException o2, 3: InvalidInputException o3, 4: InvalidObjectException o4)
  PartitionsStatsResult get_partitions_statistics_req(1: PartitionsStatsRequest request)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  ColumnStatistics get_table_column_statistics(1: string db_name, 2: string tbl_name, 3: string col_name)
      throws (1: NoSuchObjectException o1, 2: MetaException o2, 3: InvalidInputException o3, 4: InvalidObjectException o4)
  TableStatsResult get_table_statistics_req(1: TableStatsRequest request)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  bool set_aggr_stats_for(1: SetPartitionsStatsRequest request)
      throws (1: NoSuchObjectException o1, 2: InvalidObjectException o2, 3: MetaException o3, 4: InvalidInputException o4)
  bool update_partition_column_statistics(1: ColumnStatistics stats_obj)
      throws (1: NoSuchObjectException o1, 2: InvalidObjectException o2, 3: MetaException o3, 4: InvalidInputException o4)
  bool update_table_column_statistics(1: ColumnStatistics stats_obj)
      throws (1: NoSuchObjectException o1, 2: InvalidObjectException o2, 3: MetaException o3, 4: InvalidInputException o4)

  // --- Partitions ---

  Partition add_partition(1: Partition new_part)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  Partition add_partition_with_environment_context(1: Partition new_part, 2: EnvironmentContext environment_context)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  i32 add_partitions(1: list<Partition> new_parts)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  i32 add_partitions_pspec(1: list<PartitionSpec> new_parts)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  AddPartitionsResult add_partitions_req(1: AddPartitionsRequest request)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  void alter_partition(1: string db_name, 2: string tbl_name, 3: Partition new_part)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  void alter_partition_with_environment_context(1: string db_name, 2: string tbl_name, 3: Partition new_part, 4: EnvironmentContext environment_context)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  void alter_partitions(1: string db_name, 2: string tbl_name, 3: list<Partition> new_parts)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  void alter_partitions_with_environment_context(1: string db_name, 2: string tbl_name, 3: list<Partition> new_parts, 4: EnvironmentContext environment_context)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  Partition append_partition(1: string db_name, 2: string tbl_name, 3: list<string> part_vals)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  Partition append_partition_by_name(1: string db_name, 2: string tbl_name, 3: string part_name)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  Partition append_partition_by_name_with_environment_context(1: string db_name, 2: string tbl_name, 3: string part_name, 4: EnvironmentContext environment_context)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  Partition append_partition_with_environment_context(1: string db_name, 2: string tbl_name, 3: list<string> part_vals, 4: EnvironmentContext environment_context)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  bool drop_partition(1: string db_name, 2: string tbl_name, 3: list<string> part_vals, 4: bool deleteData)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  bool drop_partition_by_name(1: string db_name, 2: string tbl_name, 3: string part_name, 4: bool deleteData)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  bool drop_partition_by_name_with_environment_context(1: string db_name, 2: string tbl_name, 3: string part_name, 4: bool deleteData, 5: EnvironmentContext environment_context)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  bool drop_partition_with_environment_context(1: string db_name, 2: string tbl_name, 3: list<string> part_vals, 4: bool deleteData, 5: EnvironmentContext environment_context)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  DropPartitionsResult drop_partitions_req(1: DropPartitionsRequest req)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  Partition exchange_partition(1: map<string, string> partitionSpecs, 2: string source_db, 3: string source_table_name, 4: string dest_db, 5: string dest_table_name)
      throws (1: MetaException o1, 2: NoSuchObjectException o2, 3: InvalidObjectException o3, 4: InvalidInputException o4)
  list<Partition> exchange_partitions(1: map<string, string> partitionSpecs, 2: string source_db, 3: string source_table_name, 4: string dest_db, 5: string dest_table_name)
      throws (1: MetaException o1, 2: NoSuchObjectException o2, 3: InvalidObjectException o3, 4: InvalidInputException o4)
  i32 get_num_partitions_by_filter(1: string db_name, 2: string tbl_name, 3: string filter)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<PartitionSpec> get_part_specs_by_filter(1: string db_name, 2: string tbl_name, 3: string filter, 4: i32 max_parts)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  Partition get_partition(1: string db_name, 2: string tbl_name, 3: list<string> part_vals)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  Partition get_partition_by_name(1: string db_name, 2: string tbl_name, 3: string part_name)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<string> get_partition_names(1: string db_name, 2: string tbl_name, 3: i16 max_parts)
      throws (1: MetaException o2)
  list<string> get_partition_names_ps(1: string db_name, 2: string tbl_name, 3: list<string> part_vals, 4: i16 max_parts)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  PartitionValuesResponse get_partition_values(1: PartitionValuesRequest request)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  Partition get_partition_with_auth(1: string db_name, 2: string tbl_name, 3: list<string> part_vals, 4: string user_name, 5: list<string> group_names)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<Partition> get_partitions(1: string db_name, 2: string tbl_name, 3: i16 max_parts)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  PartitionsByExprResult get_partitions_by_expr(1: PartitionsByExprRequest req)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<Partition> get_partitions_by_filter(1: string db_name, 2: string tbl_name, 3: string filter, 4: i16 max_parts)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<Partition> get_partitions_by_names(1: string db_name, 2: string tbl_name, 3: list<string> names)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<Partition> get_partitions_ps(1: string db_name, 2: string tbl_name, 3: list<string> part_vals, 4: i16 max_parts)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<Partition> get_partitions_ps_with_auth(1: string db_name, 2: string tbl_name, 3: list<string> part_vals, 4: i16 max_parts, 5: string user_name, 6: list<string> group_names)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  list<PartitionSpec> get_partitions_pspec(1: string db_name, 2: string tbl_name, 3: i32 max_parts)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  list<Partition> get_partitions_with_auth(1: string db_name, 2: string tbl_name, 3: i16 max_parts, 4: string user_name, 5: list<string> group_names)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  bool isPartitionMarkedForEvent(1: string db_name, 2: string tbl_name, 3: map<string, string> part_vals, 4: PartitionEventType eventType)
      throws (1: MetaException o1, 2: NoSuchObjectException o2, 3: UnknownDBException o3, 4: UnknownTableException o4, 5: UnknownPartitionException o5, 6: InvalidPartitionException o6)
  void markPartitionForEvent(1: string db_name, 2: string tbl_name, 3: map<string, string> part_vals, 4: PartitionEventType eventType)
      throws (1: MetaException o1, 2: NoSuchObjectException o2, 3: UnknownDBException o3, 4: UnknownTableException o4, 5: UnknownPartitionException o5, 6: InvalidPartitionException o6)
  void rename_partition(1: string db_name, 2: string tbl_name, 3: list<string> part_vals, 4: Partition new_part)
      throws (1: InvalidOperationException o1, 2: MetaException o2)

  // --- Tables ---

  void alter_table(1: string dbname, 2: string tbl_name, 3: Table new_tbl)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  void alter_table_with_cascade(1: string dbname, 2: string tbl_name, 3: Table new_tbl, 4: bool cascade)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  void alter_table_with_environment_context(1: string dbname, 2: string tbl_name, 3: Table new_tbl, 4: EnvironmentContext environment_context)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  void create_table(1: Table tbl)
      throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3, 4: NoSuchObjectException o4)
  void create_table_with_environment_context(1: Table tbl, 2: EnvironmentContext environment_context)
      throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3, 4: NoSuchObjectException o4)
  void drop_table(1: string dbname, 2: string name, 3: bool deleteData)
      throws (1: NoSuchObjectException o1, 2: MetaException o3)
  void drop_table_with_environment_context(1: string dbname, 2: string name, 3: bool deleteData, 4: EnvironmentContext environment_context)
      throws (1: NoSuchObjectException o1, 2: MetaException o3)
  list<string> get_all_tables(1: string db_name)
      throws (1: MetaException o1)
  list<FieldSchema> get_fields(1: string db_name, 2: string table_name)
      throws (1: MetaException o1, 2: UnknownTableException o2, 3: UnknownDBException o3)
  list<FieldSchema> get_fields_with_environment_context(1: string db_name, 2: string table_name, 3: EnvironmentContext environment_context)
      throws (1: MetaException o1, 2: UnknownTableException o2, 3: UnknownDBException o3)
  list<FieldSchema> get_schema(1: string db_name, 2: string table_name)
      throws (1: MetaException o1, 2: UnknownTableException o2, 3: UnknownDBException o3)
  list<FieldSchema> get_schema_with_environment_context(1: string db_name, 2: string table_name, 3: EnvironmentContext environment_context)
      throws (1: MetaException o1, 2: UnknownTableException o2, 3: UnknownDBException o3)
  Table get_table(1: string dbname, 2: string tbl_name)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<TableMeta> get_table_meta(1: string db_patterns, 2: string tbl_patterns, 3: list<string> tbl_types)
      throws (1: MetaException o1)
  list<string> get_table_names_by_filter(1: string dbname, 2: string filter, 3: i16 max_tables)
      throws (1: MetaException o1, 2: InvalidOperationException o2, 3: UnknownDBException o3)
  list<Table> get_table_objects_by_name(1: string dbname, 2: list<string> tbl_names)
      throws (1: MetaException o1, 2: InvalidOperationException o2, 3: UnknownDBException o3)
  GetTablesResult get_table_objects_by_name_req(1: GetTablesRequest req)
      throws (1: MetaException o1, 2: InvalidOperationException o2, 3: UnknownDBException o3)
  GetTableResult get_table_req(1: GetTableRequest req)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<string> get_tables(1: string db_name, 2: string pattern)
      throws (1: MetaException o1)

  // --- Databases ---

  void alter_database(1: string dbname, 2: Database db)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  void create_database(1: Database database)
      throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3)
  void drop_database(1: string name, 2: bool deleteData, 3: bool cascade)
      throws (1: NoSuchObjectException o1, 2: InvalidOperationException o2, 3: MetaException o3)
  list<string> get_all_databases()
      throws (1: MetaException o1)
  Database get_database(1: string name)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  list<string> get_databases(1: string pattern)
      throws (1: MetaException o1)

  // =============================================================================================
  // Hive 3.x and 4.x methods (not served by Hive 2.3). get_table and get_table_objects_by_name
  // above were removed in Hive 4.0.1; their _req forms are what newer clients call.
  // =============================================================================================

  // --- Catalogs (3.0) ---
  GetCatalogsResponse get_catalogs() throws (1: MetaException o1)
  GetCatalogResponse get_catalog(1: GetCatalogRequest catName)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  void create_catalog(1: CreateCatalogRequest catalog)
      throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3)
  void alter_catalog(1: AlterCatalogRequest rqst)
      throws (1: NoSuchObjectException o1, 2: InvalidOperationException o2, 3: MetaException o3)
  void drop_catalog(1: DropCatalogRequest catName)
      throws (1: NoSuchObjectException o1, 2: InvalidOperationException o2, 3: MetaException o3)

  // --- Databases ---
  Database get_database_req(1: GetDatabaseRequest request)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  GetDatabaseObjectsResponse get_databases_req(1: GetDatabaseObjectsRequest request)
      throws (1: MetaException o1)
  void create_database_req(1: CreateDatabaseRequest createDatabaseRequest)
      throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3)
  void alter_database_req(1: AlterDatabaseRequest alterDbReq)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  void drop_database_req(1: DropDatabaseRequest req)
      throws (1: NoSuchObjectException o1, 2: InvalidOperationException o2, 3: MetaException o3)

  // --- Tables ---
  void create_table_req(1: CreateTableRequest request)
      throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3,
              4: NoSuchObjectException o4)
  // The second exception really is named o3 in Hive's IDL.
  void drop_table_req(1: DropTableRequest dropTableReq)
      throws (1: NoSuchObjectException o1, 2: MetaException o3)
  void truncate_table(1: string dbName, 2: string tableName, 3: list<string> partNames)
      throws (1: MetaException o1)
  TruncateTableResponse truncate_table_req(1: TruncateTableRequest req) throws (1: MetaException o1)
  AlterTableResponse alter_table_req(1: AlterTableRequest req)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  list<ExtendedTableInfo> get_tables_ext(1: GetTablesExtRequest req) throws (1: MetaException o1)
  GetFieldsResponse get_fields_req(1: GetFieldsRequest req)
      throws (1: MetaException o1, 2: UnknownTableException o2, 3: UnknownDBException o3)
  GetSchemaResponse get_schema_req(1: GetSchemaRequest req)
      throws (1: MetaException o1, 2: UnknownTableException o2, 3: UnknownDBException o3)
  list<Table> get_all_materialized_view_objects_for_rewriting() throws (1: MetaException o1)
  list<string> get_materialized_views_for_rewriting(1: string db_name) throws (1: MetaException o1)
  void update_creation_metadata(1: string catName, 2: string dbname, 3: string tbl_name, 4: CreationMetadata creation_metadata)
      throws (1: MetaException o1, 2: InvalidOperationException o2, 3: UnknownDBException o3)

  // --- Partitions ---
  GetPartitionResponse get_partition_req(1: GetPartitionRequest req)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  PartitionsResponse get_partitions_req(1: PartitionsRequest req)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  GetPartitionsByNamesResult get_partitions_by_names_req(1: GetPartitionsByNamesRequest req)
      throws (1: MetaException o1, 2: NoSuchObjectException o2, 3: InvalidObjectException o3)
  GetPartitionNamesPsResponse get_partition_names_ps_req(1: GetPartitionNamesPsRequest req)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<string> get_partition_names_req(1: PartitionsByExprRequest req)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<string> fetch_partition_names_req(1: PartitionsRequest partitionReq)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  GetPartitionsPsWithAuthResponse get_partitions_ps_with_auth_req(1: GetPartitionsPsWithAuthRequest req)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  list<Partition> get_partitions_by_filter_req(1: GetPartitionsByFilterRequest req)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  GetPartitionsResponse get_partitions_with_specs(1: GetPartitionsRequest request)
      throws (1: MetaException o1)
  PartitionsSpecByExprResult get_partitions_spec_by_expr(1: PartitionsByExprRequest req)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  RenamePartitionResponse rename_partition_req(1: RenamePartitionRequest req)
      throws (1: InvalidOperationException o1, 2: MetaException o2)
  Partition append_partition_req(1: AppendPartitionsRequest appendPartitionsReq)
      throws (1: InvalidObjectException o1, 2: AlreadyExistsException o2, 3: MetaException o3)
  bool drop_partition_req(1: DropPartitionRequest dropPartitionReq)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  AlterPartitionsResponse alter_partitions_req(1: AlterPartitionsRequest req)
      throws (1: InvalidOperationException o1, 2: MetaException o2)

  // --- Column statistics ---
  SetPartitionsStatsResponse update_table_column_statistics_req(1: SetPartitionsStatsRequest req)
      throws (1: NoSuchObjectException o1, 2: InvalidObjectException o2, 3: MetaException o3,
              4: InvalidInputException o4)
  SetPartitionsStatsResponse update_partition_column_statistics_req(1: SetPartitionsStatsRequest req)
      throws (1: NoSuchObjectException o1, 2: InvalidObjectException o2, 3: MetaException o3,
              4: InvalidInputException o4)
  bool delete_column_statistics_req(1: DeleteColumnStatisticsRequest req)
      throws (1: NoSuchObjectException o1, 2: MetaException o2, 3: InvalidObjectException o3,
              4: InvalidInputException o4)

  // --- Constraints ---
  UniqueConstraintsResponse get_unique_constraints(1: UniqueConstraintsRequest request)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  NotNullConstraintsResponse get_not_null_constraints(1: NotNullConstraintsRequest request)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  DefaultConstraintsResponse get_default_constraints(1: DefaultConstraintsRequest request)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  CheckConstraintsResponse get_check_constraints(1: CheckConstraintsRequest request)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  AllTableConstraintsResponse get_all_table_constraints(1: AllTableConstraintsRequest request)
      throws (1: MetaException o1, 2: NoSuchObjectException o2)
  void add_unique_constraint(1: AddUniqueConstraintRequest req)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  void add_not_null_constraint(1: AddNotNullConstraintRequest req)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  void add_default_constraint(1: AddDefaultConstraintRequest req)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)
  void add_check_constraint(1: AddCheckConstraintRequest req)
      throws (1: NoSuchObjectException o1, 2: MetaException o2)

  // --- Transactions and the notification log ---
  GetValidWriteIdsResponse get_valid_write_ids(1: GetValidWriteIdsRequest rqst)
      throws (1: NoSuchTxnException o1, 2: MetaException o2)
  AllocateTableWriteIdsResponse allocate_table_write_ids(1: AllocateTableWriteIdsRequest rqst)
      throws (1: NoSuchTxnException o1, 2: TxnAbortedException o2, 3: MetaException o3)
  NotificationEventsCountResponse get_notification_events_count(1: NotificationEventsCountRequest rqst)
  list<WriteEventInfo> get_all_write_event_info(1: GetAllWriteEventInfoRequest request)
      throws (1: MetaException o1)
  WriteNotificationLogResponse add_write_notification_log(1: WriteNotificationLogRequest rqst)
  WriteNotificationLogBatchResponse add_write_notification_log_in_batch(1: WriteNotificationLogBatchRequest rqst)

  // --- Functions (4.2) ---
  GetFunctionsResponse get_functions_req(1: GetFunctionsRequest request)
      throws (1: MetaException o1)
}
