"""The fine-tuning tasks of chapters 12 and 13 (minillm.tasks), and chapter 13's figure
(minillm.curves.plot_frontier), against hand-made cases."""
import pytest

from minillm import curves, tasks


def test_pig_latin():
    assert tasks.pig_latin("But, soft! what light through yonder window breaks?") == \
        "Utbay, oftsay! atwhay ightlay oughthray onderyay indowway eaksbray?"
    assert tasks.pig_latin("ROMEO: I am thy art; hmm") == "OMEORAY: Iway amway ythay artway; hmmay"
    assert tasks.pig_latin("thou'rt\n") == "outhay'rtay\n"
    with pytest.raises(ValueError, match="word"):
        tasks.pig_latin_word("don't")


def test_pig_latin_score():
    text = "Now is the winter of our discontent\nMade glorious summer by this sun of York"
    vocabulary = set(tasks.words(text))
    assert tasks.pig_latin_score(tasks.pig_latin(text), vocabulary) == 1.0
    assert tasks.pig_latin_score(text, vocabulary) == 0.0
    assert tasks.pig_latin_score("owNay isway eth", vocabulary) == pytest.approx(2 / 3)
    assert tasks.pig_latin_score("!!", vocabulary) == 0.0


def test_uses_target():
    assert tasks.uses_target("My Love's a rose") and tasks.uses_target("LOVING thee")
    assert not tasks.uses_target("a glove, beloved") and not tasks.uses_target("")
    assert tasks.uses_target("the king", target={"king"})
    with pytest.raises(TypeError, match="text"):
        tasks.uses_target(None)


def test_plot_frontier_draws_every_run():
    import matplotlib
    matplotlib.use("Agg")
    point = {"kl": 1.0, "attribute_rate": 0.2}
    document = {"settings": {"eval_every": 5}, "runs": [
        {"method": "dpo", "beta": 0.1, "points": [{**point, "kl": 0.0}, point],
         "history": {"chosen_logp": [-3.0, -2.0], "rejected_logp": [-3.0, -4.0]}},
        {"method": "sft", "beta": 0.3, "points": [point], "history": {"chosen_logp": [-3.0, -1.0]}}]}
    fig = curves.plot_frontier(document)
    left, right = fig.axes
    assert len(right.get_lines()) == 3  # DPO's chosen and rejected, SFT's chosen
    assert [line.get_label() for line in left.get_lines()][:2] == ["DPO β = 0.1", "SFT on the chosen"]
