"""Keeping leases alive and the queue table healthy: heartbeat, maintenance passes, compaction, vacuum."""
