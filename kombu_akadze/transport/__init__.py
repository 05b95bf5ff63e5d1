"""The kombu-facing layer: Transport (one per kombu connection), Channel, routing through exchanges, QoS.

``broker_transport = "kombu_akadze.transport:Transport"`` names the class exported here.
"""

from __future__ import annotations

from kombu_akadze.transport.channel import Channel
from kombu_akadze.transport.transport import Transport

__all__ = ["Channel", "Transport"]
