"""Test support: real servers the tests start (s3servers, apiserver); fault injection (faults)."""
