"""Orderly's Kafka topics: names, settings and typed record schemas (no dependency on app/)."""

from topics.catalog import TopicNames, TopicSpec, catalog, names

__all__ = ["TopicNames", "TopicSpec", "catalog", "names"]
