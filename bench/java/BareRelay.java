import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.util.Iterator;

/**
 * A bare byte relay in one thread with a java.nio Selector, as ddmlib relays a debugger's
 * bytes: bench/bridge_latency.py's reference for what a relay in Java costs.
 *
 * <pre>
 *   java BareRelay LISTEN_PORT TARGET_PORT   prints "ready" once listening on 127.0.0.1
 * </pre>
 */
public final class BareRelay {
  public static void main(String[] args) throws IOException {
    int listenPort = Integer.parseInt(args[0]);
    int targetPort = Integer.parseInt(args[1]);
    Selector selector = Selector.open();
    ServerSocketChannel server = ServerSocketChannel.open();
    server.bind(new InetSocketAddress("127.0.0.1", listenPort));
    server.configureBlocking(false);
    server.register(selector, SelectionKey.OP_ACCEPT);
    System.out.println("ready");
    System.out.flush();
    ByteBuffer buffer = ByteBuffer.allocateDirect(65536);
    while (true) {
      selector.select();
      Iterator<SelectionKey> keys = selector.selectedKeys().iterator();
      while (keys.hasNext()) {
        SelectionKey key = keys.next();
        keys.remove();
        if (!key.isValid()) {
          continue; // its connection was closed with the other end's, in this same pass
        }
        if (key.isAcceptable()) {
          SocketChannel client = server.accept();
          SocketChannel upstream;
          try {
            upstream = SocketChannel.open(new InetSocketAddress("127.0.0.1", targetPort));
          } catch (IOException e) {
            client.close(); // the target is not listening (yet): this client is refused
            continue;
          }
          for (SocketChannel channel : new SocketChannel[] {client, upstream}) {
            channel.socket().setTcpNoDelay(true);
            channel.configureBlocking(false);
          }
          client.register(selector, SelectionKey.OP_READ, upstream);
          upstream.register(selector, SelectionKey.OP_READ, client);
        } else if (key.isReadable()) {
          SocketChannel from = (SocketChannel) key.channel();
          SocketChannel to = (SocketChannel) key.attachment();
          buffer.clear();
          int n;
          try {
            n = from.read(buffer);
          } catch (IOException e) {
            n = -1;
          }
          if (n < 0) {
            key.cancel();
            from.close();
            to.close();
            continue;
          }
          buffer.flip();
          while (buffer.hasRemaining()) {
            to.write(buffer);
          }
        }
      }
    }
  }
}
