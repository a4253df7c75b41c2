"""Topic configs, consumer offsets and delay offsets of the reference broker, and the config files they go to.

``ConfigManagers`` is the part of ``refbroker.broker.Broker`` that plays TopicConfigManager,
ConsumerOffsetManager (with simulated consumers that keep a lag behind the queue max) and the schedule
service's delay offsets: ``topics.json``, ``consumerOffset.json`` and ``delayOffset.json`` are written through
``MessageStore.write_config`` in each profile's fastjson layout.  ``_persist_tick`` is the periodic flush
(every flushConsumerOffsetInterval) that also writes the checkpoint and hands finished transactions to the
ledger.
"""
from __future__ import annotations

from refbroker.javaorder import hashmap_capacity, order_keys
from refbroker.systopics import HALF_TOPIC, OP_TOPIC


class ConfigManagers:
    """Broker mixin: topics, consumer / delay offsets and their config files."""

    def ensure_topic(self, topic: str, queues: int = 1) -> None:
        if topic not in self.topics:
            self.topics[topic] = queues
            self.topics_version += 1
            self.topics_timestamp = self.clock.now
            if not self.down:
                self._persist_topics()

    def _topic_config(self, name: str, queues: int, perm: int = 6) -> dict:
        p = self.profile
        entry = {}
        if p.topic_config_attributes:
            entry["attributes"] = {}
        if p.topic_config_extra_fields:
            entry["order"] = False
        entry["perm"] = perm
        entry["readQueueNums"] = queues
        entry["topicFilterType"] = "SINGLE_TAG"
        entry["topicName"] = name
        if p.topic_config_extra_fields:
            entry["topicSysFlag"] = 0
        entry["writeQueueNums"] = queues
        return entry

    def _data_version(self, counter: int, timestamp: int) -> dict:
        p = self.profile
        version = {"counter": counter}
        if p.data_version_state_version:
            version["stateVersion"] = 0
        version[p.data_version_timestamp_key] = timestamp
        return version

    def _persist_topics(self, force: bool = False) -> None:
        from refbroker.javaorder import concurrent_hashmap_order

        p = self.profile
        table = {}
        defaults = [("SELF_TEST_TOPIC", 1, 6), (self.cluster, 16, 7), (self.broker_name, 1, 7),
                    ("BenchmarkTest", 1024, 6), ("OFFSET_MOVED_EVENT", 1, 6)]
        if p.name != "3.x":
            defaults += [("TBW102", 8, 7), ("SCHEDULE_TOPIC_XXXX", 18, 6)]
        if p.writes_cluster_property:
            defaults.append((f"{self.cluster}_REPLY_TOPIC", 1, 6))
        if p.persists_op_topic_config:
            defaults += [(HALF_TOPIC, 1, 6), (OP_TOPIC, 1, 6), (f"rmq_sys_REVIVE_LOG_{self.cluster}", 8, 6),
                         (f"rmq_sys_SYNC_BROKER_MEMBER_{self.broker_name}", 1, 1)]
        for name, queues, perm in defaults:
            table[name] = self._topic_config(name, queues, perm)
        for name, queues in self.topics.items():
            if name == OP_TOPIC and not p.persists_op_topic_config:
                continue       # observed: 4.9.8 never persists the op topic
            if name not in table:
                table[name] = self._topic_config(name, queues)
        obj = {"dataVersion": self._data_version(self.topics_version, self.topics_timestamp),
               "topicConfigTable": concurrent_hashmap_order(table, 1024)}
        self.store.write_config("topics.json", obj, force=force)

    def commit_offset(self, topic: str, group: str, queue_id: int, offset: int) -> None:
        self.offsets.setdefault((topic, group), {})[queue_id] = offset

    def query_offset(self, topic: str, group: str, queue_id: int) -> int:
        return self.offsets.get((topic, group), {}).get(queue_id, -1)

    def register_consumer(self, topic: str, group: str, lag: int = 0) -> None:
        """A simulated push consumer that keeps ``lag`` messages behind the queue max (never beyond it)."""
        self.consumer_groups[(topic, group)] = lag

    def _advance_consumers(self) -> None:
        for (topic, group), lag in self.consumer_groups.items():
            queues = self.topics.get(topic, 0)
            for qid in range(queues):
                max_offset = self.store.max_offset_in_queue(topic, qid)
                if max_offset == 0 and (topic, qid) not in self.store.queues:
                    continue
                current = self.query_offset(topic, group, qid)
                target = max(0, max_offset - (self.rng.randint(0, lag) if lag else 0))
                if target > current:
                    self.commit_offset(topic, group, qid, target)

    def _persist_offsets(self, force: bool = False) -> None:
        from refbroker.javaorder import concurrent_hashmap_order, hashmap_order

        self._advance_consumers()
        self.persisted_offsets = {k: dict(v) for k, v in self.offsets.items()}
        table = {f"{topic}@{group}": dict(sorted(queues.items()))
                 for (topic, group), queues in self.offsets.items()}
        table = concurrent_hashmap_order(table, 512)
        if self.profile.consumer_offset_data_version:
            group_topics: dict = {}
            for topic, group in self.offsets:
                group_topics.setdefault(group, []).append(topic)
            group_topics = {g: order_keys(ts, hashmap_capacity(len(ts))) for g, ts in group_topics.items()}
            obj = {"dataVersion": self._data_version(0, self.started_at),
                   "groupTopicMap": hashmap_order(group_topics),
                   "offsetTable": table}
        else:
            obj = {"offsetTable": table}
        self.store.write_config("consumerOffset.json", obj, force=force)

    def _persist_delay_offsets(self, force: bool = False) -> None:
        obj = {"offsetTable": dict(sorted(self.delay_offsets.items()))}
        if self.profile.consumer_offset_data_version:
            obj = {"dataVersion": self._data_version(0, self.started_at), **obj}
        self.store.write_config("delayOffset.json", obj, force=force)

    def _persist_tick(self) -> None:
        self._persist_offsets()
        self._persist_delay_offsets()
        self.store.write_checkpoint()
        self._finalize_ready()
        self.schedule(
            self.clock.now + self.profile.flushConsumerOffsetInterval, self._persist_tick, internal=True
        )


__all__ = [
    "ConfigManagers",
]
