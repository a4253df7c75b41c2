// Prints RemotingCommand frames encoded by RocketMQ's own classes (one JSON line each: name, hex), for the
// golden-bytes tests of txlog_io.remoting.  Run by tests/test_remoting.py (realbroker) against each version's
// jars; its output for 4.9.8 and 5.3.3 is kept in tests/data/remoting_golden.json.
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;

public class GoldenFrames {
    static void emit(String name, RemotingCommand cmd) {
        ByteBuffer b = cmd.encode();
        StringBuilder sb = new StringBuilder();
        while (b.hasRemaining()) sb.append(String.format("%02x", b.get() & 0xff));
        System.out.println("{\"name\": \"" + name + "\", \"hex\": \"" + sb + "\"}");
    }

    static RemotingCommand request(int code, int opaque, String[] kv, byte[] body) {
        RemotingCommand cmd = RemotingCommand.createRequestCommand(code, null);
        cmd.setOpaque(opaque);
        cmd.setVersion(Integer.parseInt(System.getProperty("golden.version", "0")));
        HashMap<String, String> ext = new HashMap<>();
        for (int i = 0; i < kv.length; i += 2) ext.put(kv[i], kv[i + 1]);
        cmd.setExtFields(ext);
        cmd.setBody(body);
        return cmd;
    }

    public static void main(String[] args) {
        emit("resume_one_field", request(323, 7, new String[]{"msgId", "7F0000010000ABCD00000000000012A0"}, null));
        RemotingCommand oneway = request(37, 8, new String[]{"msgId", "X"}, null);
        oneway.markOnewayRPC();
        emit("oneway_one_field", oneway);
        emit("with_body", request(105, 9, new String[]{"topic", "TopicRbTx"},
            "{\"a\":1}".getBytes(StandardCharsets.UTF_8)));
        RemotingCommand resp = RemotingCommand.createResponseCommand(1, "Find prepared transaction message failed");
        resp.setOpaque(10);
        resp.setVersion(0);
        emit("response_remark", resp);
        RemotingCommand end = request(37, 11, new String[]{
            "producerGroup", "PID_RB_TX", "tranStateTableOffset", "12", "commitLogOffset", "4660",
            "commitOrRollback", "8", "fromTransactionCheck", "true", "msgId", "7F00000100002A9F0000000000001234",
            "transactionId", "7F00000100002A9F0000000000001234", "topic", "TopicRbTx"}, null);
        new AclClientRPCHook(new SessionCredentials("rbAccess", "rbSecret-123")).doBeforeRequest("127.0.0.1:1", end);
        emit("acl_end_transaction", end);
        RemotingCommand body = request(12, 12, new String[]{"topic", "T", "key", "K"},
            new byte[]{1, 2, 3, (byte) 0xff});
        new AclClientRPCHook(new SessionCredentials("ak", "sk")).doBeforeRequest("127.0.0.1:1", body);
        emit("acl_with_body", body);
    }
}
