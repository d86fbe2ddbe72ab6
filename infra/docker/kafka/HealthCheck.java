import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;

/** Exit 0 when the broker at args[0] answers a describe-cluster request within 8 seconds. */
public final class HealthCheck {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "5000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "8000");
        try (Admin admin = Admin.create(props)) {
            int nodes = admin.describeCluster().nodes().get(8, TimeUnit.SECONDS).size();
            System.exit(nodes > 0 ? 0 : 1);
        } catch (Exception e) {
            System.err.println(e);
            System.exit(1);
        }
    }
}
