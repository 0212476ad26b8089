"""The continual few-shot learning family (CFSL; papers/cfsl-task-definitions.txt, notes 002.1-002.4).

GTEP's two phases with CFSL tasks: an ordering s of a phase is `tasks_per_ordering` tasks sampled from the
phase's classes with (study seed, s) (generator.py), so a set H_r is scored on S x tasks_per_ordering
tasks of D^HT, and H* on as many fresh ones of the disjoint D^E; both phases use the same task type.

The data flow is "continual_few_shot" (gtep/engine/flows/continual_few_shot.py runs it): a learner starts
each task afresh (from the study's pretrained backbone), sees the task's support sets one at a time through an
iterator that yields each once, and only then scores the target set.

Metrics (gtep/protocol/families/cfsl/metrics.py): target_acc (mean over the ordering's tasks; H*'s default criterion
mean_target_acc), its std and 95% interval over tasks (target_acc_task_std, target_acc_ci95), target_ce
likewise, atm (bytes held / bytes of the support inputs as the learner receives them), atm_count (the paper's
Eq. 1 as written: stored vectors / support samples) and macs (means over tasks).
Aliases for the parts of gtep that read the class-incremental names (tables' Acc/AvgAcc/HM columns, the
trainable's running score, MLflow's per-task `acc_t` steps):

    acc = avg_acc = target_acc     acc_t = target_acc_t (step t: task t of the ordering)

Pure: stdlib and numpy only.
"""
from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

from gtep.protocol.criteria import Criterion, register_criterion
from gtep.protocol.families.base import (
    ACC,
    ACC_T,
    AVG_ACC,
    Metric,
    PhaseData,
    PhaseLayout,
    Problem,
    ScenarioFamily,
    StudyLayout,
    add_aliases,
    curve,
    register_family,
)
from gtep.protocol.families.cfsl import metrics as cfsl_metrics
from gtep.protocol.families.cfsl.generator import CfslOptions

CFSL = "cfsl"
CONTINUAL_FEW_SHOT = "continual_few_shot"
ALIASES = {"acc": "target_acc", "avg_acc": "target_acc", "acc_t": "target_acc_t"}

# <name>_task_std: the std over an ordering's tasks (<name>_std is what tracking calls the std over orderings);
# target accuracy is a fraction (percent in MLflow); cross-entropy and ATM are ratios, MACs a count
METRICS = (Metric("target_acc", "target acc"), Metric("target_acc_task_std", "target acc std (tasks)"),
           Metric("target_acc_ci95", "target acc 95% CI"), Metric("target_ce", "target CE", "ratio"),
           Metric("target_ce_task_std", "target CE std (tasks)", "ratio"),
           Metric("target_ce_ci95", "target CE 95% CI", "ratio"), Metric("atm", "ATM (bytes)", "ratio"),
           Metric("atm_count", "ATM (count)", "ratio"), Metric("macs", "MACs", "count", selectable=False),
           ACC, AVG_ACC, curve("target_acc_t", "target acc after task t"), ACC_T)


# the criteria of this family's metrics (search.criterion)
register_criterion(Criterion("mean_target_acc", ("target_acc",),
               "CFSL: target-set accuracy after the last support set, mean over the ordering's tasks"))


@register_family
class ContinualFewShot(ScenarioFamily):
    name = CFSL
    section = CFSL
    description = ("continual few-shot learning: NSS support sets seen once each, then a target set "
                   "(scenario.cfsl)")
    data_flow = CONTINUAL_FEW_SHOT
    Options = CfslOptions
    metrics = METRICS
    default_criterion = cfsl_metrics.DEFAULT_CRITERION_METRIC
    headline: ClassVar[tuple[str, ...]] = ("target_acc", "target_acc_task_std", "target_acc_ci95", "target_ce", "atm",
                                           "atm_count", "macs")
    table_metrics = ("target_acc", "atm", "macs")
    table_note = ("CFSL: target acc in %, ATM (across-task memory, relative to the backbone's bytes) and MACs per "
                  "task, mean (std) over orderings; criterion: the value of the criterion H* was selected by, %")

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        """The classes of a task's class blocks: NC per block, NSS / CCI blocks."""
        spec = CfslOptions.of(options)
        return [spec.ways] * spec.blocks

    def data_classes(self, options: Mapping[str, Any]) -> tuple[int, ...]:
        return ()

    def check_layout(self, phases: Sequence[PhaseLayout], study: StudyLayout,
                     options: Mapping[str, Any]) -> list[Problem]:
        """A task takes NC * NSS / CCI classes of its phase: each phase must have them (each class's images are
        counted by `check`)."""
        spec = CfslOptions.of(options)
        return [Problem("scenario.cfsl", f"a task takes {spec.classes_per_task} classes (ways {spec.ways} x "
                        f"support_sets {spec.support_sets} / class_change_interval {spec.class_change_interval}) but "
                        f"the {phase.phase} phase has {len(phase.classes)} ({phase.dataset}); lower ways or "
                        "support_sets, raise class_change_interval, or give the phase more classes")
                for phase in phases if len(phase.classes) < spec.classes_per_task]

    def check(self, phases: Sequence[PhaseData], options: Mapping[str, Any]) -> list[Problem]:
        return [problem for phase in phases for problem in self.pool_problems(phase, options)]

    def example_options(self) -> dict[str, Any]:
        return {"support_sets": 2, "ways": 2, "shots": 1, "target_shots": 1, "class_change_interval": 1,
                "overwrite": False, "tasks_per_ordering": 2}

    def option_problems(self, options: Mapping[str, Any]) -> list[Problem]:
        problem = CfslOptions.of(options).problem()
        return [Problem("scenario.cfsl", problem)] if problem else []

    def summary(self, options: Mapping[str, Any]) -> str:
        return CfslOptions.of(options).describe()

    def pool_problems(self, phase: PhaseData, options: Mapping[str, Any]) -> list[Problem]:
        """A task takes CCI x (K_S + K_T) distinct images of each of its classes from the phase's pooled training
        and test images; any class of the phase can be drawn, so each needs them (a short class would otherwise
        fail inside a Ray trial, where resuming cannot help)."""
        spec = CfslOptions.of(options)
        need = spec.samples_per_class
        pooled = {c: phase.train_counts.get(c, 0) + phase.test_counts.get(c, 0) for c in phase.classes}
        short = [(c, n) for c, n in pooled.items() if n < need]
        if not short:
            return []
        listed = ", ".join(f"class {c} has {n}" for c, n in short[:5])
        return [Problem("scenario.cfsl", f"a task takes {need} images of each class (class_change_interval "
                        f"{spec.class_change_interval} x (shots {spec.shots} + target_shots {spec.target_shots})), "
                        f"but in the {phase.phase} phase {listed} ({len(short)} classes short, {phase.dataset}); "
                        "lower shots or target_shots, or leave those classes out", phase.phase)]

    def describe(self, phase: PhaseData, options: Mapping[str, Any], seed: int) -> list[tuple[str, int]]:
        spec = CfslOptions.of(options)
        task = (f"{spec.support_sets} support sets of {spec.ways} ways x {spec.shots} shots, then a target set of "
                f"{spec.target_shots} per class and support set")
        return [(task, spec.support_sets * spec.ways * spec.shots)] * spec.tasks_per_ordering


def with_aliases(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """CFSL's metrics plus the class-incremental names gtep's tables and score read (module docstring)."""
    return add_aliases(metrics, ALIASES)
