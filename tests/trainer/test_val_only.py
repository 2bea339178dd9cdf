"""trainer.val_only's closing line: each data_source's accuracy, slashes in names and kk_logic's sizes kept."""

from logicrl.trainer.validation import val_only_line


def test_each_source_then_all():
    val = {"val/score": 0.1, "val/acc": 0.5, "val/math/acc": 0.25, "val/lighteval/MATH/acc": 0.75,
           "val/kk_logic/acc": 0.5, "val/kk_logic/3ppl/acc": 1.0}
    assert val_only_line(val) == ("logicrl: validation accuracy per data_source: kk_logic 0.500, kk_logic/3ppl 1.000, "
                                  "lighteval/MATH 0.750, math 0.250; all 0.500")
