"""`orderly worker`: the Faust stream processor around the pure core (I/O shell).

app.py wires the parts; runtime.py is the running worker (its agent, rebalance, membership, lag and
stall handlers, and what the seams ask of it); batch.py decides a batch; commit.py is one commit's
steps in order; transactions.py stages exactly-once writes; store.py is the table's local store;
recovery.py reads the changelogs' exact ends; consumer.py paces commits and fetches; shared.py is
what batches tell the commits; exits.py is when and how the worker ends itself for a restart.
Everything Faust, mode and aiokafka are made to do from the inside is in app/seams/.
"""

from app.worker.app import build_app, run
from app.worker.store import TABLE, changelog_topic

__all__ = ["TABLE", "build_app", "changelog_topic", "run"]
