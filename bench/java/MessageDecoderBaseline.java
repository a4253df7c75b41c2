/*
 * Licensed to the Apache Software Foundation (ASF) under one or more
 * contributor license agreements.  See the NOTICE file distributed with
 * this work for additional information regarding copyright ownership.
 * The ASF licenses this file to You under the Apache License, Version 2.0
 * (the "License"); you may not use this file except in compliance with
 * the License.  You may obtain a copy of the License at
 *
 *     http://www.apache.org/licenses/LICENSE-2.0
 *
 * Unless required by applicable law or agreed to in writing, software
 * distributed under the License is distributed on an "AS IS" BASIS,
 * WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
 * See the License for the specific language governing permissions and
 * limitations under the License.
 */

/*
 * The Java baseline of `txlog-bench decode --java`: RocketMQ's own CommitLog record decoder, run over the
 * same files as our decoder, to tell whether "decode at 0.25 of raw read" is attainable on this machine.
 *
 * Ported (Apache-2.0, see above) from apache/rocketmq tag rocketmq-all-5.3.3,
 * common/src/main/java/org/apache/rocketmq/common/message/:
 *   - MessageDecoder.decode(ByteBuffer, readBody, deCompressBody, isClient, isSetPropertiesString, checkCRC),
 *     called as decode(buf, true, false, false, false, false) -- decode(buf, readBody=true,
 *     deCompressBody=false, isClient=false);
 *   - MessageDecoder.string2messageProperties, MessageDecoder.createMessageId, UtilAll.bytes2string;
 *   - MessageExt.getStoreHostBytes / socketAddress2ByteBuffer, MessageVersion.getTopicLength;
 *   - the fields of Message / MessageExt that decode sets.
 * Every operation of that path is kept: the field reads, InetAddress.getByAddress + InetSocketAddress for
 * both hosts, the new byte[] body copy, new String(topic, UTF_8), new String(properties, UTF_8) and
 * string2messageProperties (HashMap(128) as in 5.x; 4.9.x uses the default capacity), the msgId
 * through a ByteBuffer of the store host's bytes and the commit log offset, hex-encoded.  Left out: the
 * compression branch (deCompressBody=false skips it), the CRC branch (checkCRC=false) and MessageClientExt
 * (isClient=false).
 *
 * Walk: records by TOTALSIZE from the start of each file, as the broker's recovery does
 * (CommitLog.checkMessageAndReturnSize), through a direct ByteBuffer that FileChannel.read fills chunk by
 * chunk (one copy out of the page cache, like our preadv; the broker decodes slices of direct
 * MappedByteBuffers); a BLANK or zero header ends a file.  Decoded messages are kept in a ring of 1024 so
 * the JIT cannot drop the work.  One thread; with -XX:+UseSerialGC a collection runs (in the VM thread)
 * while it is stopped, never beside it; JIT compiler threads do run beside it.  The CPU time reported is
 * every thread's, exact (processCpuNanos), like the CPU time of our decoding process.
 *
 * Usage: java MessageDecoderBaseline PASSES CHUNK_BYTES FILE...   -> one JSON line per pass, then a summary.
 */

import java.lang.management.ManagementFactory;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.HashMap;
import java.util.Map;

public final class MessageDecoderBaseline {

    // ------------------------------------------------------------------ ported: MessageDecoder (5.3.3)
    static final Charset CHARSET_UTF8 = StandardCharsets.UTF_8;
    static final int MESSAGE_MAGIC_CODE = -626843481;
    static final int MESSAGE_MAGIC_CODE_V2 = -626843477;
    static final int BLANK_MAGIC_CODE = -875286124;
    static final char NAME_VALUE_SEPARATOR = 1;
    static final char PROPERTY_SEPARATOR = 2;
    // MessageSysFlag
    static final int BORNHOST_V6_FLAG = 0x1 << 4;
    static final int STOREHOSTADDRESS_V6_FLAG = 0x1 << 5;

    static final char[] HEX_ARRAY = "0123456789ABCDEF".toCharArray();

    /** Message + MessageExt: the fields decode sets (setters inlined as field stores). */
    static final class MessageExt {
        String topic;
        int flag;
        Map<String, String> properties;
        byte[] body;
        String transactionId;
        String brokerName;
        int queueId;
        int storeSize;
        long queueOffset;
        int sysFlag;
        long bornTimestamp;
        SocketAddress bornHost;
        long storeTimestamp;
        SocketAddress storeHost;
        String msgId;
        long commitLogOffset;
        int bodyCRC;
        int reconsumeTimes;
        long preparedTransactionOffset;

        ByteBuffer getStoreHostBytes() {
            return socketAddress2ByteBuffer(this.storeHost);
        }
    }

    /** MessageExt.socketAddress2ByteBuffer(SocketAddress). */
    static ByteBuffer socketAddress2ByteBuffer(SocketAddress socketAddress) {
        InetSocketAddress inetSocketAddress = (InetSocketAddress) socketAddress;
        InetAddress address = inetSocketAddress.getAddress();
        ByteBuffer byteBuffer;
        if (address instanceof java.net.Inet4Address) {
            byteBuffer = ByteBuffer.allocate(4 + 4);
        } else {
            byteBuffer = ByteBuffer.allocate(16 + 4);
        }
        byteBuffer.put(address.getAddress());
        byteBuffer.putInt(inetSocketAddress.getPort());
        byteBuffer.flip();
        return byteBuffer;
    }

    /** UtilAll.bytes2string. */
    static String bytes2string(byte[] src) {
        char[] hexChars = new char[src.length * 2];
        for (int j = 0; j < src.length; j++) {
            int v = src[j] & 0xFF;
            hexChars[j * 2] = HEX_ARRAY[v >>> 4];
            hexChars[j * 2 + 1] = HEX_ARRAY[v & 0x0F];
        }
        return new String(hexChars);
    }

    static String createMessageId(final ByteBuffer input, final ByteBuffer addr, final long offset) {
        input.flip();
        int msgIDLength = addr.limit() == 8 ? 16 : 28;
        input.limit(msgIDLength);
        input.put(addr);
        input.putLong(offset);
        return bytes2string(input.array());
    }

    /** MessageVersion.getTopicLength(ByteBuffer). */
    static int getTopicLength(int magicCode, ByteBuffer buffer) {
        if (magicCode == MESSAGE_MAGIC_CODE) {
            return buffer.get();
        }
        if (magicCode == MESSAGE_MAGIC_CODE_V2) {
            return buffer.getShort();
        }
        throw new IllegalArgumentException("Invalid magicCode " + magicCode);
    }

    /** decode(byteBuffer, readBody=true, deCompressBody=false, isClient=false), i.e.
     *  isSetPropertiesString=false, checkCRC=false: the branches those flags switch off are not ported. */
    static MessageExt decode(ByteBuffer byteBuffer) {
        try {
            MessageExt msgExt = new MessageExt();
            int storeSize = byteBuffer.getInt();                              // 1 TOTALSIZE
            msgExt.storeSize = storeSize;
            int magicCode = byteBuffer.getInt();                              // 2 MAGICCODE
            if (magicCode != MESSAGE_MAGIC_CODE && magicCode != MESSAGE_MAGIC_CODE_V2) {
                throw new IllegalArgumentException("Invalid magicCode " + magicCode);  // valueOfMagicCode
            }
            msgExt.bodyCRC = byteBuffer.getInt();                             // 3 BODYCRC
            msgExt.queueId = byteBuffer.getInt();                             // 4 QUEUEID
            msgExt.flag = byteBuffer.getInt();                                // 5 FLAG
            msgExt.queueOffset = byteBuffer.getLong();                        // 6 QUEUEOFFSET
            msgExt.commitLogOffset = byteBuffer.getLong();                    // 7 PHYSICALOFFSET
            int sysFlag = byteBuffer.getInt();                                // 8 SYSFLAG
            msgExt.sysFlag = sysFlag;
            msgExt.bornTimestamp = byteBuffer.getLong();                      // 9 BORNTIMESTAMP
            int bornhostIPLength = (sysFlag & BORNHOST_V6_FLAG) == 0 ? 4 : 16;  // 10 BORNHOST
            byte[] bornHost = new byte[bornhostIPLength];
            byteBuffer.get(bornHost, 0, bornhostIPLength);
            int port = byteBuffer.getInt();
            msgExt.bornHost = new InetSocketAddress(InetAddress.getByAddress(bornHost), port);
            msgExt.storeTimestamp = byteBuffer.getLong();                     // 11 STORETIMESTAMP
            int storehostIPLength = (sysFlag & STOREHOSTADDRESS_V6_FLAG) == 0 ? 4 : 16;  // 12 STOREHOST
            byte[] storeHost = new byte[storehostIPLength];
            byteBuffer.get(storeHost, 0, storehostIPLength);
            port = byteBuffer.getInt();
            msgExt.storeHost = new InetSocketAddress(InetAddress.getByAddress(storeHost), port);
            msgExt.reconsumeTimes = byteBuffer.getInt();                      // 13 RECONSUMETIMES
            msgExt.preparedTransactionOffset = byteBuffer.getLong();          // 14 PREPARED TX OFFSET
            int bodyLen = byteBuffer.getInt();                                // 15 BODY
            if (bodyLen > 0) {
                byte[] body = new byte[bodyLen];
                byteBuffer.get(body);
                msgExt.body = body;
                msgExt.sysFlag = sysFlag;
            }
            int topicLen = getTopicLength(magicCode, byteBuffer);            // 16 TOPIC
            byte[] topic = new byte[topicLen];
            byteBuffer.get(topic);
            msgExt.topic = new String(topic, CHARSET_UTF8);
            short propertiesLength = byteBuffer.getShort();                   // 17 properties
            if (propertiesLength > 0) {
                byte[] properties = new byte[propertiesLength];
                byteBuffer.get(properties);
                String propertiesString = new String(properties, CHARSET_UTF8);
                msgExt.properties = string2messageProperties(propertiesString);
            }
            int msgIDLength = storehostIPLength + 4 + 8;
            ByteBuffer byteBufferMsgId = ByteBuffer.allocate(msgIDLength);
            msgExt.msgId = createMessageId(byteBufferMsgId, msgExt.getStoreHostBytes(),
                msgExt.commitLogOffset);
            return msgExt;
        } catch (Exception e) {
            byteBuffer.position(byteBuffer.limit());
        }
        return null;
    }

    static Map<String, String> string2messageProperties(final String properties) {
        Map<String, String> map = new HashMap<>(128);
        if (properties != null) {
            int len = properties.length();
            int index = 0;
            while (index < len) {
                int newIndex = properties.indexOf(PROPERTY_SEPARATOR, index);
                if (newIndex < 0) {
                    newIndex = len;
                }
                if (newIndex - index >= 3) {
                    int kvSepIndex = properties.indexOf(NAME_VALUE_SEPARATOR, index);
                    if (kvSepIndex > index && kvSepIndex < newIndex - 1) {
                        String k = properties.substring(index, kvSepIndex);
                        String v = properties.substring(kvSepIndex + 1, newIndex);
                        map.put(k, v);
                    }
                }
                index = newIndex + 1;
            }
        }
        return map;
    }

    // ------------------------------------------------------------------ the bench (not ported)
    static final MessageExt[] SINK = new MessageExt[1024];
    static long records, bodyBytes, topicChars, propertyEntries, msgIdChars, fileBytes;

    /** Decodes every record of one file; false (and why, on stderr) when a record does not decode. */
    static boolean decodeFile(String path, ByteBuffer buf) throws Exception {
        try (FileChannel ch = FileChannel.open(Paths.get(path), StandardOpenOption.READ)) {
            buf.clear();
            boolean eof = fill(ch, buf);
            buf.flip();
            long filePos = 0;                         // file position of buf.position()
            while (true) {
                int p = buf.position();
                int rem = buf.remaining();
                int total = rem >= 8 ? buf.getInt(p) : 0;
                if (rem < 8 || (total > rem && total <= buf.capacity())) {
                    if (eof) {
                        return true;                  // file ends (its last bytes: no full record)
                    }
                    buf.compact();
                    eof = fill(ch, buf);
                    buf.flip();
                    continue;
                }
                int magic = buf.getInt(p + 4);
                if (magic == BLANK_MAGIC_CODE || (total == 0 && magic == 0)) {
                    return true;                      // end of this file's data
                }
                if (total > buf.capacity() || total < 8) {
                    System.err.println(path + ": TOTALSIZE " + total + " at " + filePos + " does not fit");
                    return false;
                }
                MessageExt msg = decode(buf);
                if (msg == null) {
                    System.err.println(path + ": record at " + filePos + " does not decode");
                    return false;
                }
                buf.position(p + total);
                filePos += total;
                SINK[(int) (records & 1023)] = msg;
                records++;
                bodyBytes += msg.body == null ? 0 : msg.body.length;
                topicChars += msg.topic.length();
                propertyEntries += msg.properties == null ? 0 : msg.properties.size();
                msgIdChars += msg.msgId.length();
            }
        }
    }

    /** Reads until the buffer is full or the file ends; true at the end of the file. */
    static boolean fill(FileChannel ch, ByteBuffer buf) throws Exception {
        while (buf.hasRemaining()) {
            int n = ch.read(buf);
            if (n < 0) {
                return true;
            }
            fileBytes += n;
        }
        return false;
    }

    /** CPU nanoseconds of every thread of this process (GC and JIT threads too) from
     *  /proc/self/task/TID/schedstat, whose first field is exact; OperatingSystemMXBean.getProcessCpuTime
     *  comes from times(), in clock ticks of 10 ms: on a 0.2 s pass that is +-5 %, and the best of several
     *  passes then picks a favourable rounding.  A thread that ended between two readings is not counted
     *  (none ends during a pass here).  -1 where /proc is not readable. */
    static long processCpuNanos() {
        try (var tasks = java.nio.file.Files.list(Paths.get("/proc/self/task"))) {
            long sum = 0;
            for (var t : (Iterable<java.nio.file.Path>) tasks::iterator) {
                try {
                    String stat = java.nio.file.Files.readString(t.resolve("schedstat"));
                    sum += Long.parseLong(stat.substring(0, stat.indexOf(' ')));
                } catch (java.io.IOException | RuntimeException gone) {
                    // the thread ended while listed
                }
            }
            return sum;
        } catch (java.io.IOException | RuntimeException e) {
            return -1;
        }
    }

    public static void main(String[] args) throws Exception {
        int passes = Integer.parseInt(args[0]);
        ByteBuffer buf = ByteBuffer.allocateDirect(Integer.parseInt(args[1]));
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        double best = Double.MAX_VALUE;
        double bestCpu = Double.MAX_VALUE;
        double first = 0;
        for (int pass = 0; pass < passes; pass++) {
            records = bodyBytes = topicChars = propertyEntries = msgIdChars = fileBytes = 0;
            long p0 = processCpuNanos();
            long c0 = os.getProcessCpuTime();
            long t0 = System.nanoTime();
            for (int i = 2; i < args.length; i++) {
                if (!decodeFile(args[i], buf)) {
                    System.exit(2);
                }
            }
            double s = (System.nanoTime() - t0) / 1e9;
            long c1 = os.getProcessCpuTime();
            long p1 = processCpuNanos();
            double cpu = (p0 >= 0 && p1 >= 0 ? p1 - p0 : c1 - c0) / 1e9;
            if (pass == 0) {
                first = s;
            }
            best = Math.min(best, s);
            bestCpu = Math.min(bestCpu, cpu);
            System.out.printf("{\"pass\": %d, \"s\": %.6f, \"cpu_s\": %.6f}%n", pass, s, cpu);
        }
        System.out.printf("{\"passes\": %d, \"first_s\": %.6f, \"best_s\": %.6f, \"best_cpu_s\": %.6f, "
                + "\"bytes\": %d, \"records\": %d, \"body_bytes\": %d, \"topic_chars\": %d, "
                + "\"property_entries\": %d, \"msg_id_chars\": %d}%n", passes, first, best, bestCpu,
                fileBytes, records, bodyBytes, topicChars, propertyEntries, msgIdChars);
    }
}
