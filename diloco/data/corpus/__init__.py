"""Prepared corpora: documents in, tokenized ArrayRecord shards and their manifest out."""
