"""`rabbitmqctl list_queues name messages` where rabbitmqctl is not installed (CI): the same lines, read
over AMQP for the queues named. argv: AMQP_URL VHOST_SHOWN QUEUE..."""

from __future__ import annotations

import sys

import kombu

url, vhost, *queues = sys.argv[1:]
with kombu.Connection(url, connect_timeout=10) as conn:
    channel = conn.default_channel
    print(f"Timeout: 60.0 seconds ...\nListing queues for vhost {vhost} ...\nname\tmessages")
    for queue in queues:
        _, messages, _ = channel.queue_declare(queue=queue, passive=True)
        print(f"{queue}\t{messages}")
