"""The data side: raw text -> sharded Arrow corpus (Beam), and shards -> training batches."""
