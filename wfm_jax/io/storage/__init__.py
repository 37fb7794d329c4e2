"""Object storage (S3) for data shards, checkpoints and exports: credentials, client, mirror."""
