"""Iteration order of Java's HashMap / ConcurrentHashMap for String and Integer keys.

RocketMQ serialises properties by iterating a ``java.util.HashMap`` and writes config JSON from
``ConcurrentHashMap`` tables, so the order of entries on disk is the map's bucket order, not insertion order.
The reference broker reproduces it so that its records look like a real broker's byte for byte:

* bucket index = spread(hash) & (capacity - 1), spread(h) = h ^ (h >>> 16) (Java 8+ HashMap and
  ConcurrentHashMap; CHM additionally masks the sign bit, which never changes the index for capacity <= 2^30);
* within one bucket entries keep insertion order (resizes split buckets without reordering, and treeified
  bins need > 8 colliding keys, which property maps never have);
* capacity: HashMap starts at ``tableSizeFor(initial)`` (16 by default) and doubles whenever size exceeds
  0.75 * capacity; ``new ConcurrentHashMap(n)`` starts at ``tableSizeFor(n + n/2 + 1)``.

Checked against the fixtures: properties of 3.1.4 and 4.9.8 records follow a default HashMap (16), those a
5.3.3 broker re-serialised follow capacity 128 (``string2messageProperties``), op messages built inside the
broker a default HashMap; topics.json follows ``new ConcurrentHashMap(1024)`` (2048 buckets) and
consumerOffset.json's offsetTable ``new ConcurrentHashMap(512)`` (1024 buckets).
"""
from __future__ import annotations

from typing import Iterable, Mapping

from txlog_io.properties import java_string_hash


def table_size_for(n: int) -> int:
    """HashMap.tableSizeFor: the smallest power of two >= n (at least 1)."""
    size = 1
    while size < n:
        size <<= 1
    return size


def hashmap_capacity(entries: int, initial_capacity: int = 16) -> int:
    """Capacity of a HashMap created with ``initial_capacity`` after ``entries`` insertions."""
    capacity = table_size_for(max(1, initial_capacity))
    while entries > capacity * 3 // 4:
        capacity <<= 1
    return capacity


def concurrent_hashmap_capacity(entries: int, initial_capacity: int) -> int:
    """Capacity of ``new ConcurrentHashMap(initial_capacity)`` after ``entries`` insertions."""
    capacity = table_size_for(initial_capacity + (initial_capacity >> 1) + 1)
    while entries >= capacity - (capacity >> 2):   # sizeCtl = 0.75 n; resize when size >= sizeCtl
        capacity <<= 1
    return capacity


def java_hash(key) -> int:
    """hashCode of a Java String or Integer key as an unsigned 32-bit value."""
    if isinstance(key, int):
        return key & 0xFFFFFFFF
    return java_string_hash(str(key)) & 0xFFFFFFFF


def bucket_index(key, capacity: int) -> int:
    h = java_hash(key)
    return ((h ^ (h >> 16)) & 0x7FFFFFFF) & (capacity - 1)


def order_keys(keys: Iterable, capacity: int) -> list:
    """Keys (given in insertion order) in the iteration order of a hash table with ``capacity`` buckets."""
    keyed = [(bucket_index(k, capacity), i, k) for i, k in enumerate(keys)]
    keyed.sort()
    return [k for _, _, k in keyed]


def hashmap_order(mapping: Mapping, initial_capacity: int = 16) -> dict:
    """A dict with the entries of ``mapping`` (insertion order) re-ordered as a java.util.HashMap iterates
    them."""
    capacity = hashmap_capacity(len(mapping), initial_capacity)
    return {k: mapping[k] for k in order_keys(mapping.keys(), capacity)}


def concurrent_hashmap_order(mapping: Mapping, initial_capacity: int) -> dict:
    """Same for ``new ConcurrentHashMap(initial_capacity)``."""
    capacity = concurrent_hashmap_capacity(len(mapping), initial_capacity)
    return {k: mapping[k] for k in order_keys(mapping.keys(), capacity)}


__all__ = ["hashmap_order", "concurrent_hashmap_order", "order_keys", "hashmap_capacity",
           "concurrent_hashmap_capacity", "bucket_index"]
