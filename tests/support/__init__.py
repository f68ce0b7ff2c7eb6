"""Test support: real servers the tests start (s3servers, apiserver; users and
policies on MinIO: minio_admin); fault injection (faults)."""
