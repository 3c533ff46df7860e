// HiveMQ Community Edition, embedded, for fxgate's tests and demo (actors/devtools/hivemq.py).
// Arguments: the configuration folder (config.xml), the data folder, the extensions folder.
// Prints "fxgate-hivemq: started" once the listeners are up; SIGTERM stops the broker
// gracefully (its file persistence closed, sessions and queues kept) before the JVM exits.

import com.hivemq.embedded.EmbeddedHiveMQ;
import java.nio.file.Path;

public final class FxgateHiveMQ {
    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: FxgateHiveMQ CONFIG_FOLDER DATA_FOLDER EXTENSIONS_FOLDER");
            System.exit(2);
        }
        EmbeddedHiveMQ broker = EmbeddedHiveMQ.builder()
                .withConfigurationFolder(Path.of(args[0]))
                .withDataFolder(Path.of(args[1]))
                .withExtensionsFolder(Path.of(args[2]))
                .build();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                broker.stop().join();
                broker.close();
                System.out.println("fxgate-hivemq: stopped");
            } catch (Exception error) {
                error.printStackTrace();
            }
            System.out.flush();
        }, "fxgate-hivemq-stop"));
        broker.start().join();
        System.out.println("fxgate-hivemq: started");
        System.out.flush();
        Thread.currentThread().join();
    }
}
