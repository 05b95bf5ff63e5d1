"""How a consuming connection decides what to claim and when: pure logic, no kombu and no psycopg.

Claim rounds and fairness (rounds.py), the outcome buffer (outcomes.py), the deadline flush
(flusher.py), wake-ups and the event-loop driver (events.py). The transport layer feeds them its
channels' state and gets plans and callbacks back; the store layer runs what they decide.
"""
