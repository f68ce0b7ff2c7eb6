"""Test support: real S3 servers (s3servers) and a fault-injecting store (faults)."""
