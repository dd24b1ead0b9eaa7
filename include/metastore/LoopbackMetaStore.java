// A Hive metastore Thrift service bound to one address (loopback by default).
//
// Hive 2.3's own HiveMetaStore main() always binds to every interface; this launcher
// builds the same handler and serves it on the address given, so a laptop or CI
// machine never exposes its metastore to the network.
//
// Usage: java -cp "<conf dir>:<pyspark>/jars/*:<this dir>" LoopbackMetaStore <host> <port>
import java.net.InetAddress;
import java.net.InetSocketAddress;

import org.apache.hadoop.hive.conf.HiveConf;
import org.apache.hadoop.hive.metastore.HiveMetaStore;

import org.apache.hadoop.hive.metastore.api.ThriftHiveMetastore;
import org.apache.thrift.protocol.TBinaryProtocol;
import org.apache.thrift.server.TThreadPoolServer;
import org.apache.thrift.transport.TServerSocket;
import org.apache.thrift.transport.TTransportFactory;

public final class LoopbackMetaStore {
    private LoopbackMetaStore() {}

    public static void main(String[] args) throws Exception {
        String host = args.length > 0 ? args[0] : "127.0.0.1";
        int port = args.length > 1 ? Integer.parseInt(args[1]) : 9083;
        HiveConf conf = new HiveConf(HiveMetaStore.HMSHandler.class);
        ThriftHiveMetastore.Iface handler = HiveMetaStore.newRetryingHMSHandler("loopback metastore", conf, false);
        TServerSocket socket = new TServerSocket(new InetSocketAddress(InetAddress.getByName(host), port));
        TThreadPoolServer.Args serverArgs = new TThreadPoolServer.Args(socket)
            .processor(new ThriftHiveMetastore.Processor<>(handler))
            .transportFactory(new TTransportFactory())
            .protocolFactory(new TBinaryProtocol.Factory())
            .minWorkerThreads(4)
            .maxWorkerThreads(64);
        System.out.println("metastore listening on " + host + ":" + port);
        System.out.flush();
        new TThreadPoolServer(serverArgs).serve();
    }
}
