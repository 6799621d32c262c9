"""EchoService.assessments: each path's assessment is built once per verdict
change, not at every read (the daemon reads a rail's paths at each change of
any of them: rebuilding them all was O(paths²) for a rail blackhole)."""

from linkpassd.adapters.echo import EchoService, ProbePath
from linkpassd.core.model import Assessment


def service(n: int) -> EchoService:
    paths = [ProbePath(f"eth{r}", f"198.18.{r}.2", f"198.19.{r}.{k + 1}")
             for r in range(2) for k in range(n)]
    return EchoService(paths=paths, respond=False)


def counting(svc: EchoService) -> list[int]:
    built = [0]
    for prober in svc.probers.values():
        original = prober.assessment

        def assess(original=original):
            built[0] += 1
            return original()
        prober.assessment = assess  # type: ignore[method-assign]
    return built


def test_reads_reuse_each_paths_assessment_until_it_changes():
    svc = service(64)
    built = counting(svc)
    first = svc.assessments("eth0")
    assert len(first) == 64 and built[0] == 64
    for _ in range(10):
        assert svc.assessments("eth0") == first
    assert built[0] == 64  # nothing rebuilt
    prober = next(pr for p, pr in svc.probers.items() if p.port == "eth0")
    changed = Assessment(first[0].signal, None, "suspect", "confirming")
    svc._changed(prober, changed)
    again = svc.assessments("eth0")
    assert changed in again and built[0] == 64
    assert len(svc.assessments()) == 128 and built[0] == 128  # eth1's, once


def test_a_removed_path_is_forgotten():
    svc = service(2)
    svc.assessments()
    gone = next(iter(svc.probers))
    svc.set_paths([p for p in svc.probers if p != gone])
    assert gone not in svc._assessed and len(svc.assessments()) == 3
