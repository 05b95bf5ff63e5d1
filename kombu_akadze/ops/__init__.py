"""Operating a broker: the ``akadze`` CLI, stats, metrics, dead letters and moving queues off RabbitMQ."""
