"""Benchmark clients (`deltaserve bench serve`)."""
