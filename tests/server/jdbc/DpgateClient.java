// A JDBC client against `dpgate serve` (Debian's pgjdbc driver), run by tests/server/test_jdbc_client.py as
// `java -cp postgresql.jar DpgateClient.java <port> <user> <password>`.  Each result is printed as one
// tab-separated line the Python test parses: KIND<TAB>field<TAB>field...  A failing step prints
// "ERROR<TAB>step<TAB>sqlstate<TAB>message" and the program goes on, so the test sees every failure at once.
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

public class DpgateClient {
    interface Step {
        void run() throws SQLException;
    }

    static void step(String name, Step body) {
        try {
            body.run();
        } catch (SQLException e) {
            String message = String.valueOf(e.getMessage()).replace('\n', ' ').replace('\t', ' ');
            System.out.println("ERROR\t" + name + "\t" + e.getSQLState() + "\t" + message);
        }
    }

    static String row(ResultSet rs) throws SQLException {
        ResultSetMetaData md = rs.getMetaData();
        List<String> cells = new ArrayList<>();
        for (int i = 1; i <= md.getColumnCount(); i++) {
            cells.add(String.valueOf(rs.getString(i)));
        }
        return String.join("\t", cells);
    }

    static void print(String kind, ResultSet rs) throws SQLException {
        while (rs.next()) {
            System.out.println(kind + "\t" + row(rs));
        }
    }

    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/pums";
        Properties props = new Properties();
        props.setProperty("user", args[1]);
        props.setProperty("password", args[2]);
        props.setProperty("connectTimeout", "10");
        props.setProperty("socketTimeout", "60");
        try (Connection con = DriverManager.getConnection(url, props)) {
            System.out.println("CONNECTED\t" + con.getMetaData().getDatabaseProductName());
            step("count", () -> {
                try (Statement st = con.createStatement(); ResultSet rs = st.executeQuery("SELECT COUNT(*) FROM pums")) {
                    print("COUNT", rs);
                }
            });
            step("group", () -> {
                try (Statement st = con.createStatement();
                     ResultSet rs = st.executeQuery("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex")) {
                    print("GROUP", rs);
                }
            });
            step("prepared", () -> {
                try (PreparedStatement ps = con.prepareStatement("SELECT COUNT(*) FROM pums WHERE age < ?")) {
                    ps.setInt(1, 30);
                    try (ResultSet rs = ps.executeQuery()) {
                        print("PREPARED", rs);
                    }
                    // pgjdbc switches to a named server-side statement from the 5th execution (prepareThreshold)
                    for (int i = 0; i < 5; i++) {
                        try (ResultSet rs = ps.executeQuery()) {
                            print("PREPARED_AGAIN", rs);
                        }
                    }
                }
            });
            step("tables", () -> {
                DatabaseMetaData md = con.getMetaData();
                try (ResultSet rs = md.getTables(null, null, "%", new String[] {"TABLE"})) {
                    while (rs.next()) {
                        System.out.println("TABLE\t" + rs.getString("TABLE_SCHEM") + "\t" + rs.getString("TABLE_NAME")
                                + "\t" + rs.getString("TABLE_TYPE"));
                    }
                }
            });
            step("columns", () -> {
                DatabaseMetaData md = con.getMetaData();
                try (ResultSet rs = md.getColumns(null, null, "pums", "%")) {
                    while (rs.next()) {
                        System.out.println("COLUMN\t" + rs.getString("COLUMN_NAME") + "\t" + rs.getString("TYPE_NAME")
                                + "\t" + rs.getInt("DATA_TYPE") + "\t" + rs.getInt("ORDINAL_POSITION") + "\t" + rs.getString("REMARKS"));
                    }
                }
            });
            step("schemas", () -> {
                try (ResultSet rs = con.getMetaData().getSchemas()) {
                    while (rs.next()) {
                        System.out.println("SCHEMA\t" + rs.getString("TABLE_SCHEM"));
                    }
                }
            });
            step("keys", () -> {  // DBeaver and Metabase read keys and indexes on connect: none are declared
                DatabaseMetaData md = con.getMetaData();
                ResultSet[] sets = {md.getPrimaryKeys(null, "public", "pums"), md.getImportedKeys(null, "public", "pums"),
                                    md.getExportedKeys(null, "public", "pums"), md.getIndexInfo(null, "public", "pums", false, true)};
                int rows = 0;
                for (ResultSet rs : sets) {
                    while (rs.next()) {
                        rows++;
                    }
                    rs.close();
                }
                System.out.println("KEYS\t" + rows);
            });
            step("typeinfo", () -> {
                try (ResultSet rs = con.getMetaData().getTypeInfo()) {
                    int rows = 0;
                    while (rs.next()) {
                        rows++;
                    }
                    System.out.println("TYPEINFO\t" + rows);
                }
            });
            step("search_path", () -> {
                try (Statement st = con.createStatement(); ResultSet rs = st.executeQuery("SHOW search_path")) {
                    print("SEARCH_PATH", rs);
                }
            });
            step("explain", () -> {
                try (Statement st = con.createStatement();
                     ResultSet rs = st.executeQuery("EXPLAIN SELECT COUNT(*) FROM pums WHERE married")) {
                    ResultSetMetaData md = rs.getMetaData();
                    List<String> names = new ArrayList<>();
                    for (int i = 1; i <= md.getColumnCount(); i++) {
                        names.add(md.getColumnName(i));
                    }
                    System.out.println("EXPLAIN_COLUMNS\t" + String.join("\t", names));
                    print("EXPLAIN", rs);
                }
            });
        }
        System.out.println("DONE");
    }
}
