"""Notebook 15's exercises (fault tolerance with torchft): a heal that leaves the restarted group training on other
weights than the live one, checked on real replica groups killed and restarted; and the samples a dead group's share
loses between its death and its heal.

15.1 runs the learner's script as 2 replica groups through a failure drill and compares, from the observer's records,
what each optimizer step of the restarted group applied and left with the live group's (``healing``): about 25 s on 2
cores (two torchft groups started, one of them twice)."""

from __future__ import annotations

from ..i18n import N_
from .core import Context, Spec, register
from .healing import HealCheck
from .observing import Variants

# 15.2: ft_train.py as 4 replica groups of one rank, 32 samples per group per step; group 2 last committed step 500 and,
# started again, healed at step 560 (its heal record's step: the step it joined at).
GROUPS, BATCH, LAST_COMMIT, JOINED_AT = 4, 32, 500, 560


def warm_up_then_decay(step: int) -> float:
    """15.1's learning rate at step ``step`` (from 0), as the starter sets it: 20 steps of warm-up, then 1/sqrt."""
    return 0.01 * min((step + 1) / 20, (20 / (step + 1)) ** 0.5)


def samples_not_trained_on(ctx: Context) -> int:
    """15.2: group 2's samples that no weights were trained on, from its death to the step after which it trains with
    the others. Every step it did not take part in is one batch of its share lost: the steps after its last commit, up to
    and including the step it healed in (torchft leaves the healing group's own gradient out of that step: section 2,
    ``participants`` counts the others). A step that failed when it died (an all-reduce with a dead peer) was committed
    by nobody and is taken again without it: no extra batch."""
    healing_step = JOINED_AT + 1  # the step its first commit after the heal makes
    return (healing_step - LAST_COMMIT) * BATCH


register(Spec("15.1", N_("A heal that restores all the next step depends on"), solution="15_1_train.py",
              verify=HealCheck(variants=Variants(), schedule=warm_up_then_decay, schedule_text=N_(
                  "the starter's, 0.01 x min((s + 1) / 20, (20 / (s + 1)) ** 0.5) at step s, changing from step to "
                  "step")),
              hints=(N_("Run the check: the restarted group's first step applied the same averaged gradient as group "
                        "0's and still left other weights, or a later step did. Section 2: what does the live group "
                        "send, and what else, besides the weights and the gradient, decides what an AdamW step does? "
                        "Which step does a group that was started again think it is at?"),
                     N_("AdamW keeps a state beside the weights (its moments and its step count): send "
                        "inner.state_dict() in state_dict() and load it in load_state_dict(). And count the steps "
                        "with manager.current_step(), the quorum's step, which torchft heals: the loop's own counter "
                        "starts at 0 in a restarted group, and so does its warm-up."))))
register(Spec("15.2", N_("The samples a dead group's share loses"), solution="15_2.py",
              expected=samples_not_trained_on,
              wrong={(560 - 500) * 32: N_("that stops at the step group 2 joined at: the step it heals in counts too. "
                                          "Its own gradient there came from its stale weights, and torchft left it "
                                          "out (participants counted the other 3 groups)"),
                     (561 - 500): N_("that is the batches of group 2's share; the question asks for the samples, "
                                     "32 per batch"),
                     (560 - 500): N_("that is a count of batches, and it stops at the step group 2 joined at: "
                                     "the question asks for samples, and the step it heals in counts too"),
                     (562 - 500) * 32: N_("one step too many: group 2 last committed step 500, so its batch of step "
                                          "500 was trained on; the first step without it is 501"),
                     (561 - 500) * 32 * 3: N_("that counts the other groups' samples: they were trained on, every "
                                              "step")},
              hints=(N_("Sections 1 and 2: which steps did group 2 not take part in? The first is the one after its "
                        "last commit; in the step it heals in, whose gradient does torchft average?"),
                     N_("Group 2's share is lost in steps 501 to 561: 561 is the step it heals in (it joined at "
                        "560, and that step's commit makes 561), with its own gradient left out. One batch of 32 "
                        "samples per step."))))
