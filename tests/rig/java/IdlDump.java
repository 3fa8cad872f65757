import java.util.Map;
import org.apache.thrift.TBase;
import org.apache.thrift.TEnum;
import org.apache.thrift.TFieldIdEnum;
import org.apache.thrift.TFieldRequirementType;
import org.apache.thrift.meta_data.EnumMetaData;
import org.apache.thrift.meta_data.FieldMetaData;
import org.apache.thrift.meta_data.FieldValueMetaData;
import org.apache.thrift.meta_data.ListMetaData;
import org.apache.thrift.meta_data.MapMetaData;
import org.apache.thrift.meta_data.SetMetaData;
import org.apache.thrift.meta_data.StructMetaData;
import org.apache.thrift.protocol.TType;

/**
 * Prints the wire shape of Thrift classes compiled into the Hive jars, one line per struct,
 * service method (args and result) or enum, for tests/rig/test_idl_matches_hive.py to compare
 * with the project's own IDL. Arguments: a service class, then struct and enum class names.
 */
public class IdlDump {
  static String type(FieldValueMetaData v) {
    if (v instanceof StructMetaData) return ((StructMetaData) v).structClass.getSimpleName();
    if (v instanceof ListMetaData) return "list<" + type(((ListMetaData) v).elemMetaData) + ">";
    if (v instanceof SetMetaData) return "set<" + type(((SetMetaData) v).elemMetaData) + ">";
    if (v instanceof MapMetaData) {
      MapMetaData m = (MapMetaData) v;
      return "map<" + type(m.keyMetaData) + "," + type(m.valueMetaData) + ">";
    }
    if (v instanceof EnumMetaData) return ((EnumMetaData) v).enumClass.getSimpleName();
    switch (v.type) {
      case TType.BOOL: return "bool";
      case TType.BYTE: return "byte";
      case TType.I16: return "i16";
      case TType.I32: return "i32";
      case TType.I64: return "i64";
      case TType.DOUBLE: return "double";
      case TType.STRING: return v.isBinary() ? "binary" : "string";
      default: return "type" + v.type;
    }
  }

  static void struct(String kind, Class<?> c) throws Exception {
    Map<?, ?> fields = (Map<?, ?>) c.getField("metaDataMap").get(null);
    StringBuilder out = new StringBuilder(kind + " " + c.getSimpleName());
    for (Map.Entry<?, ?> e : fields.entrySet()) {
      FieldMetaData md = (FieldMetaData) e.getValue();
      boolean required = md.requirementType == TFieldRequirementType.REQUIRED;
      out.append(" ").append(((TFieldIdEnum) e.getKey()).getThriftFieldId()).append(":")
          .append(required ? "required " : "").append(type(md.valueMetaData)).append(" ")
          .append(md.fieldName).append(";");
    }
    System.out.println(out);
  }

  public static void main(String[] args) throws Exception {
    for (Class<?> inner : Class.forName(args[0]).getDeclaredClasses()) {
      String n = inner.getSimpleName();
      if ((n.endsWith("_args") || n.endsWith("_result")) && TBase.class.isAssignableFrom(inner)) {
        struct("method", inner);
      }
    }
    for (int i = 1; i < args.length; i++) {
      Class<?> c = Class.forName(args[i]);
      if (TBase.class.isAssignableFrom(c)) {
        struct("struct", c);
      } else if (c.isEnum() && TEnum.class.isAssignableFrom(c)) {
        StringBuilder out = new StringBuilder("enum " + c.getSimpleName());
        for (Object o : c.getEnumConstants()) {
          out.append(" ").append(((Enum<?>) o).name()).append("=").append(((TEnum) o).getValue()).append(";");
        }
        System.out.println(out);
      }
    }
  }
}
