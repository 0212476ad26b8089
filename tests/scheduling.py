"""How pytest-xdist shares the tests out (tests/conftest.py's tables say which tests go together): xdist's
LoadScopeScheduling, with the longest scopes handed out first, and a worker that crashes (a test that kills its
own process, a Ray that takes the worker down with it) costs its test, not the session.

xdist 3.8's own remove_node queues every work unit of the crashed worker again, finished ones too, and the
crashed test with them. A finished unit handed to a worker sends it nothing to run; the worker then waits for a
next test that never comes (it keeps its last test until one arrives), and the controller waits for that test's
report: the session hangs (stop 62's slow group, after a worker's Ray died). Here the finished units stay
finished, and the crashed test, reported failed once, is not run a second time.

Written against pytest-xdist 3.8, which pyproject's dev extra pins: the methods overridden here and the queues
read are xdist's private ones."""
from __future__ import annotations

from typing import Callable, Sequence

from xdist.scheduler import LoadScopeScheduling


class ScopeScheduling(LoadScopeScheduling):
    """Work units from `scope_of(nodeid)`, those named in `longest_first` handed out before the rest, in its order.

    An entry names a unit, or a module whose tests are units of their own: xdist otherwise queues units by their
    number of tests, so one-test units, however long, would go last and keep a worker busy after the other ran
    out of work."""

    scope_of: Callable[[str], str] = staticmethod(lambda nodeid: nodeid.split("::")[0])
    longest_first: Sequence[str] = ()

    def _split_scope(self, nodeid: str) -> str:
        return type(self).scope_of(nodeid)

    def _assign_work_unit(self, node) -> None:
        for entry in self.longest_first:  # the longest waiting unit first, then xdist's order
            scope = next((s for s in self.workqueue if s == entry or s.startswith(entry + "::")), None)
            if scope is not None:
                self.workqueue.move_to_end(scope, last=False)
                break
        super()._assign_work_unit(node)

    def remove_node(self, node) -> str | None:
        """The node gone (its work done, or crashed): a crashed node's test that was running is returned (xdist
        reports it failed), and only the tests it had not yet run go back to the queue, for the other nodes and
        the crashed node's replacement."""
        workload = self.assigned_work.pop(node)
        if not self._pending_of(workload):
            return None
        crashed = next(nodeid for unit in workload.values() for nodeid, done in unit.items() if not done)
        for scope, unit in workload.items():
            unit.pop(crashed, None)  # reported failed by xdist: not run again
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed
