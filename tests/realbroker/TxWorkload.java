/*
 * Transactional workload for the real-broker tests (tests/realbroker/).  Compiled by the harness with javac
 * against the fetched RocketMQ client jars of one version (4.9.8 or 5.3.3; the API used here is common to both)
 * and run against a real NameServer + broker on 127.0.0.1.
 *
 * Every decision is written as one JSON line to --log (flushed per line): what the producer answered at send
 * time and at each check-back, plus what the broker shows through ordinary pulls (the committed messages of the
 * real topic and the halves the broker moved to TRANS_CHECK_MAX_TIME_TOPIC).  That log is the truth the tests
 * compare the audit with.  Lines: {"event": "send" | "check" | "died" | "view" | "phase" | "error", ...}.
 *
 * A transaction's class is encoded in its KEYS ("RB-<class>-<n>"), so any producer instance of the group (also
 * one started after a crash) answers a check-back the same way:
 *   commit / rollback           COMMIT / ROLLBACK at send
 *   check_commit / check_rollback   UNKNOW at send, COMMIT / ROLLBACK on the first check
 *   check2_commit               UNKNOW at send and on check 1, COMMIT on check 2
 *   discard                     UNKNOW always (the broker discards it after transactionCheckMax checks)
 *   died_commit / died_discard  sent by a producer JVM that halts inside executeLocalTransaction (mode "die",
 *                               so it never answers); the surviving producer of the group answers the broker's
 *                               checks with COMMIT / UNKNOW
 *   inflight_commit / inflight_rollback   sent at the very end of mode "run" (UNKNOW, with
 *                               CHECK_IMMUNITY_TIME_IN_SECONDS = --immunity-s when > 0), just before the harness
 *                               stops or kills the broker; a check before that is answered UNKNOW; mode
 *                               "answer" (after a broker restart) answers them COMMIT / ROLLBACK
 *
 * Modes:
 *   die     send the died_* halves from N threads, each blocking in executeLocalTransaction; once all halves
 *           were stored, log them and Runtime.halt (no END_TRANSACTION, no shutdown)
 *   run     send the seeded workload, answer checks, wait until the broker resolved everything (answers given,
 *           discards visible in TRANS_CHECK_MAX_TIME_TOPIC), wait for op records to be written, log the
 *           broker's view, then send the inflight halves and exit
 *   answer  answer checks until every inflight key got its final answer (or --timeout-s), wait, log the view
 *
 * Exit 0: done; 3: the broker did not do what was expected within --timeout-s (see the "error" line).
 */

import java.io.FileOutputStream;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

public class TxWorkload {
    static final String DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC";

    static PrintWriter log;
    static final Map<String, AtomicInteger> checks = new ConcurrentHashMap<>();
    static final Map<String, String> finalAnswer = new ConcurrentHashMap<>();
    static volatile String mode;

    // ---- tiny JSON writer ------------------------------------------------------------------------------------
    static String q(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static String obj(Object... kv) {
        StringBuilder b = new StringBuilder("{");
        for (int i = 0; i < kv.length; i += 2) {
            if (i > 0) {
                b.append(", ");
            }
            b.append(q((String) kv[i])).append(": ");
            Object v = kv[i + 1];
            if (v == null) {
                b.append("null");
            } else if (v instanceof Number || v instanceof Boolean) {
                b.append(v);
            } else if (v instanceof Iterable) {
                b.append('[');
                boolean first = true;
                for (Object o : (Iterable<?>) v) {
                    b.append(first ? "" : ", ").append(q(String.valueOf(o)));
                    first = false;
                }
                b.append(']');
            } else {
                b.append(q(String.valueOf(v)));
            }
        }
        return b.append('}').toString();
    }

    static synchronized void emit(Object... kv) {
        log.println(obj(kv));
        log.flush();
    }

    // ---- classes -------------------------------------------------------------------------------------------
    static String classOf(String keys) {
        if (keys == null || !keys.startsWith("RB-")) {
            return "?";
        }
        int dash = keys.lastIndexOf('-');
        return keys.substring(3, dash);
    }

    static LocalTransactionState atSend(String cls) {
        switch (cls) {
            case "commit":
                return LocalTransactionState.COMMIT_MESSAGE;
            case "rollback":
                return LocalTransactionState.ROLLBACK_MESSAGE;
            default:
                return LocalTransactionState.UNKNOW;
        }
    }

    static LocalTransactionState atCheck(String cls, int n) {
        switch (cls) {
            case "commit":
            case "check_commit":
            case "died_commit":
                return LocalTransactionState.COMMIT_MESSAGE;
            case "rollback":
            case "check_rollback":
                return LocalTransactionState.ROLLBACK_MESSAGE;
            case "check2_commit":
                return n >= 2 ? LocalTransactionState.COMMIT_MESSAGE : LocalTransactionState.UNKNOW;
            case "inflight_commit":
                return "answer".equals(mode) ? LocalTransactionState.COMMIT_MESSAGE : LocalTransactionState.UNKNOW;
            case "inflight_rollback":
                return "answer".equals(mode) ? LocalTransactionState.ROLLBACK_MESSAGE : LocalTransactionState.UNKNOW;
            default:
                return LocalTransactionState.UNKNOW;
        }
    }

    static String name(LocalTransactionState s) {
        return s == LocalTransactionState.COMMIT_MESSAGE ? "COMMIT" : s == LocalTransactionState.ROLLBACK_MESSAGE
            ? "ROLLBACK" : "UNKNOW";
    }

    // ---- options -------------------------------------------------------------------------------------------
    static Map<String, String> opts = new HashMap<>();

    static String opt(String k, String dflt) {
        String v = opts.get(k);
        return v == null ? dflt : v;
    }

    static int iopt(String k, int dflt) {
        return Integer.parseInt(opt(k, String.valueOf(dflt)));
    }

    static Map<String, Integer> counts(String spec) {
        Map<String, Integer> m = new LinkedHashMap<>();
        if (spec == null || spec.isEmpty()) {
            return m;
        }
        for (String part : spec.split(",")) {
            String[] kv = part.split("=");
            m.put(kv[0].trim(), Integer.parseInt(kv[1].trim()));
        }
        return m;
    }

    static TransactionMQProducer producer(String group, TransactionListener listener) throws Exception {
        TransactionMQProducer p = new TransactionMQProducer(group);
        p.setNamesrvAddr(opt("namesrv", "127.0.0.1:9876"));
        p.setInstanceName(group + "-" + mode + "-" + System.nanoTime());
        p.setSendMsgTimeout(10000);
        // a producer started while the broker is down (mode "answer") must reach it soon after it is back
        p.setPollNameServerInterval(1000);
        p.setHeartbeatBrokerInterval(1000);
        p.setTransactionListener(listener);
        p.setExecutorService(Executors.newFixedThreadPool(4));
        p.start();
        return p;
    }

    static Message message(String topic, String key, Random rnd) {
        byte[] body = new byte[40 + rnd.nextInt(400)];
        for (int i = 0; i < body.length; i++) {
            body[i] = (byte) ('a' + rnd.nextInt(26));
        }
        Message m = new Message(topic, rnd.nextBoolean() ? "create" : "pay", key, body);
        m.putUserProperty("bizId", "biz-" + rnd.nextInt(1000000));
        return m;
    }

    static class Listener implements TransactionListener {
        @Override
        public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
            String cls = classOf(msg.getKeys());
            LocalTransactionState s = atSend(cls);
            emit("event", "send", "mode", mode, "key", msg.getKeys(), "class", cls, "uniq",
                MessageClientIDSetter.getUniqID(msg), "tx_id", msg.getTransactionId(), "answer", name(s),
                "t", System.currentTimeMillis());
            if (s != LocalTransactionState.UNKNOW) {
                finalAnswer.put(msg.getKeys(), name(s));
            }
            return s;
        }

        @Override
        public LocalTransactionState checkLocalTransaction(MessageExt msg) {
            String cls = classOf(msg.getKeys());
            int n = checks.computeIfAbsent(msg.getKeys(), k -> new AtomicInteger()).incrementAndGet();
            LocalTransactionState s = atCheck(cls, n);
            emit("event", "check", "mode", mode, "key", msg.getKeys(), "class", cls, "n", n, "uniq",
                MessageClientIDSetter.getUniqID(msg), "tx_id", msg.getTransactionId(), "check_times",
                msg.getProperty("TRANSACTION_CHECK_TIMES"), "commitlog_offset", msg.getCommitLogOffset(),
                "queue_offset", msg.getQueueOffset(), "answer", name(s), "t", System.currentTimeMillis());
            if (s != LocalTransactionState.UNKNOW) {
                finalAnswer.put(msg.getKeys(), name(s));
            }
            return s;
        }
    }

    /** KEYS of every message in topic (all queues, from offset 0), read with ordinary pulls. */
    static Set<String> pullKeys(DefaultMQPullConsumer c, String topic) throws Exception {
        Set<String> keys = new TreeSet<>();
        for (MessageQueue mq : c.fetchSubscribeMessageQueues(topic)) {
            long offset = 0;
            while (true) {
                PullResult r = c.pull(mq, "*", offset, 64);
                if (r.getPullStatus() != PullStatus.FOUND) {
                    break;
                }
                for (MessageExt m : r.getMsgFoundList()) {
                    if (m.getKeys() != null) {
                        keys.add(m.getKeys());
                    }
                }
                offset = r.getNextBeginOffset();
            }
        }
        return keys;
    }

    static Set<String> pullKeysOrEmpty(DefaultMQPullConsumer c, String topic) {
        try {
            return pullKeys(c, topic);
        } catch (Exception e) {
            return new TreeSet<>();   // topic not created (yet): nothing there
        }
    }

    static DefaultMQPullConsumer puller() throws Exception {
        DefaultMQPullConsumer c = new DefaultMQPullConsumer("CID_RB_VIEW_" + mode);
        c.setNamesrvAddr(opt("namesrv", "127.0.0.1:9876"));
        c.setInstanceName("view-" + mode + "-" + System.nanoTime());
        c.start();
        return c;
    }

    static void view(String topic) throws Exception {
        DefaultMQPullConsumer c = puller();
        try {
            emit("event", "view", "mode", mode, "topic", topic, "committed", pullKeysOrEmpty(c, topic),
                "discarded", pullKeysOrEmpty(c, DISCARD_TOPIC), "t", System.currentTimeMillis());
        } finally {
            c.shutdown();
        }
    }

    static String causes(Throwable e) {
        StringBuilder b = new StringBuilder();
        for (Throwable t = e; t != null; t = t.getCause()) {
            b.append(b.length() > 0 ? " <- " : "").append(t);
            if (t.getCause() == t) {
                break;
            }
        }
        return b.toString();
    }

    /** Create the real topic on the broker (4 queues) and wait until the NameServer routes it. */
    static void ensureTopic(String topic, long deadline) throws Exception {
        DefaultMQAdminExt admin = new DefaultMQAdminExt("rb-admin-" + mode);
        admin.setNamesrvAddr(opt("namesrv", "127.0.0.1:9876"));
        admin.setInstanceName("rb-admin-" + mode + "-" + System.nanoTime());
        admin.start();
        try {
            admin.createAndUpdateTopicConfig(opt("broker", "127.0.0.1:10911"), new TopicConfig(topic, 4, 4, 6));
            while (true) {
                try {
                    admin.examineTopicRouteInfo(topic);
                    return;
                } catch (Exception e) {
                    if (System.currentTimeMillis() > deadline) {
                        fail("no route for " + topic + ": " + causes(e));
                    }
                    Thread.sleep(200);
                }
            }
        } finally {
            admin.shutdown();
        }
    }

    static void fail(String what) {
        emit("event", "error", "mode", mode, "what", what, "t", System.currentTimeMillis());
        log.close();
        System.err.println("TxWorkload: " + what);
        System.exit(3);
    }

    public static void main(String[] args) throws Exception {
        mode = args[0];
        for (int i = 1; i + 1 < args.length; i += 2) {
            opts.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        log = new PrintWriter(new OutputStreamWriter(new FileOutputStream(opt("log", "workload.jsonl"), true),
            StandardCharsets.UTF_8));
        String group = opt("group", "PID_RB_TX");
        String topic = opt("topic", "TopicRbTx");
        long seed = Long.parseLong(opt("seed", "1"));
        long timeoutMs = iopt("timeout-s", 60) * 1000L;
        int opFlushMs = iopt("op-flush-ms", 1000);
        Random rnd = new Random(seed ^ mode.hashCode());
        emit("event", "phase", "mode", mode, "phase", "start", "t", System.currentTimeMillis());

        if (!mode.equals("answer")) {
            ensureTopic(topic, System.currentTimeMillis() + timeoutMs);
        }
        if (mode.equals("die")) {
            Map<String, Integer> cnt = counts(opt("counts", "died_commit=2,died_discard=2"));
            List<String> keys = new ArrayList<>();
            for (Map.Entry<String, Integer> e : cnt.entrySet()) {
                for (int i = 0; i < e.getValue(); i++) {
                    keys.add("RB-" + e.getKey() + "-" + i);
                }
            }
            final CountDownLatch inside = new CountDownLatch(keys.size());
            final CountDownLatch never = new CountDownLatch(1);
            TransactionMQProducer p = producer(group, new TransactionListener() {
                @Override
                public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                    emit("event", "died", "mode", mode, "key", msg.getKeys(), "class", classOf(msg.getKeys()),
                        "uniq", MessageClientIDSetter.getUniqID(msg), "tx_id", msg.getTransactionId(),
                        "t", System.currentTimeMillis());
                    inside.countDown();
                    try {
                        never.await();   // the JVM halts while every thread waits here
                    } catch (InterruptedException ignored) {
                    }
                    return LocalTransactionState.UNKNOW;
                }

                @Override
                public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                    try {
                        never.await();   // a check reaching the dying producer is never answered either
                    } catch (InterruptedException ignored) {
                    }
                    return LocalTransactionState.UNKNOW;
                }
            });
            ExecutorService pool = Executors.newFixedThreadPool(keys.size());
            for (final String k : keys) {
                pool.submit(() -> {
                    try {
                        p.sendMessageInTransaction(message(topic, k, new Random(seed + k.hashCode())), null);
                    } catch (Exception e) {
                        emit("event", "error", "mode", mode, "key", k, "what", causes(e));
                    }
                });
            }
            if (!inside.await(timeoutMs, TimeUnit.MILLISECONDS)) {
                fail("die: not every half was stored within the timeout");
            }
            emit("event", "phase", "mode", mode, "phase", "halt", "t", System.currentTimeMillis());
            log.close();
            Runtime.getRuntime().halt(0);
        }

        Listener listener = new Listener();
        TransactionMQProducer p = producer(group, listener);
        emit("event", "phase", "mode", mode, "phase", "online", "t", System.currentTimeMillis());
        if (mode.equals("run")) {
            Map<String, Integer> cnt = counts(opt("counts", ""));
            List<String> keys = new ArrayList<>();
            for (Map.Entry<String, Integer> e : cnt.entrySet()) {
                for (int i = 0; i < e.getValue(); i++) {
                    keys.add("RB-" + e.getKey() + "-" + i);
                }
            }
            Collections.shuffle(keys, rnd);
            for (String k : keys) {
                SendResult r = p.sendMessageInTransaction(message(topic, k, rnd), null);
                emit("event", "sent", "mode", mode, "key", k, "status", String.valueOf(r.getSendStatus()),
                    "msg_id", r.getMsgId(), "offset_msg_id", r.getOffsetMsgId(), "queue_id",
                    r.getMessageQueue().getQueueId(), "queue_offset", r.getQueueOffset());
            }
            // what must happen before the store is final: every check-answered class answered, every
            // never-answered class discarded by the broker (visible in TRANS_CHECK_MAX_TIME_TOPIC)
            Set<String> toAnswer = new TreeSet<>();
            Set<String> toDiscard = new TreeSet<>();
            for (String k : keys) {
                String cls = classOf(k);
                if (cls.equals("discard")) {
                    toDiscard.add(k);
                } else if (cls.startsWith("check")) {
                    toAnswer.add(k);
                }
            }
            for (Map.Entry<String, Integer> e : counts(opt("died", "")).entrySet()) {
                for (int i = 0; i < e.getValue(); i++) {
                    String k = "RB-" + e.getKey() + "-" + i;
                    (e.getKey().equals("died_commit") ? toAnswer : toDiscard).add(k);
                }
            }
            long deadline = System.currentTimeMillis() + timeoutMs;
            DefaultMQPullConsumer c = puller();
            Set<String> discarded = new HashSet<>();
            while (true) {
                Set<String> open = new TreeSet<>(toAnswer);
                open.removeAll(finalAnswer.keySet());
                if (!toDiscard.isEmpty()) {
                    discarded = pullKeysOrEmpty(c, DISCARD_TOPIC);
                }
                Set<String> notYet = new TreeSet<>(toDiscard);
                notYet.removeAll(discarded);
                if (open.isEmpty() && notYet.isEmpty()) {
                    break;
                }
                if (System.currentTimeMillis() > deadline) {
                    c.shutdown();
                    fail("run: unanswered " + open + ", not discarded " + notYet);
                }
                Thread.sleep(300);
            }
            c.shutdown();
            Thread.sleep(opFlushMs);   // 5.x batches op records in memory for transactionOpBatchInterval
            view(topic);
            int inflight = iopt("inflight", 0);
            List<String> late = new ArrayList<>();
            for (int i = 0; i < inflight; i++) {
                late.add("RB-" + (i % 2 == 0 ? "inflight_commit" : "inflight_rollback") + "-" + i);
            }
            for (String k : late) {
                Message m = message(topic, k, rnd);
                // no check-back before this many seconds: the halves stay unchecked while the harness stops or
                // kills the broker (a graceful stop takes seconds) and until a producer is back after a restart
                if (iopt("immunity-s", 0) > 0) {
                    m.putUserProperty("CHECK_IMMUNITY_TIME_IN_SECONDS", opt("immunity-s", "0"));
                }
                SendResult r = p.sendMessageInTransaction(m, null);
                emit("event", "sent", "mode", mode, "key", k, "status", String.valueOf(r.getSendStatus()),
                    "msg_id", r.getMsgId(), "offset_msg_id", r.getOffsetMsgId(), "queue_id",
                    r.getMessageQueue().getQueueId(), "queue_offset", r.getQueueOffset());
            }
            emit("event", "phase", "mode", mode, "phase", "done", "t", System.currentTimeMillis());
            System.out.println("READY");
            System.out.flush();
        } else if (mode.equals("answer")) {
            Set<String> want = new TreeSet<>();
            int inflight = iopt("inflight", 0);
            for (int i = 0; i < inflight; i++) {
                want.add("RB-" + (i % 2 == 0 ? "inflight_commit" : "inflight_rollback") + "-" + i);
            }
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (true) {
                Set<String> open = new TreeSet<>(want);
                open.removeAll(finalAnswer.keySet());
                if (open.isEmpty()) {
                    break;
                }
                if (System.currentTimeMillis() > deadline) {
                    fail("answer: no check-back for " + open);
                }
                // started while the broker was down: learn the real topic's route as soon as the broker is
                // back and register with it (heartbeat), so that its check-backs find this producer
                try {
                    p.getDefaultMQProducerImpl().getMqClientFactory().updateTopicRouteInfoFromNameServer(topic);
                    p.getDefaultMQProducerImpl().getMqClientFactory().sendHeartbeatToAllBrokerWithLock();
                } catch (Exception e) {
                    // the broker is not back yet
                }
                Thread.sleep(300);
            }
            Thread.sleep(opFlushMs);
            view(topic);
            emit("event", "phase", "mode", mode, "phase", "done", "t", System.currentTimeMillis());
        } else {
            fail("unknown mode " + mode);
        }
        p.shutdown();
        log.close();
        System.exit(0);
    }
}
