"""`orderly worker`: the Faust stream processor around the pure core (I/O shell).

app.py wires the Faust app and runs it; batch.py decides a batch; store.py is the table's local
store; transactions.py stages exactly-once writes; consumer.py paces commits and fetches; shared.py
is what batches tell the consumer; exits.py is when and how the worker ends itself for a restart.
"""

from app.worker.app import build_app, run
from app.worker.store import TABLE, changelog_topic

__all__ = ["TABLE", "build_app", "changelog_topic", "run"]
