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


def test_plot_frontier_plots_each_runs_numbers():
    import matplotlib
    matplotlib.use("Agg")
    document = {"settings": {"eval_every": 5}, "runs": [
        {"method": "dpo", "beta": 0.1, "points": [{"kl": 0.0, "attribute_rate": 0.05}, {"kl": 2.5, "attribute_rate": 0.4}],
         "history": {"chosen_logp": [-3.0, -2.0], "rejected_logp": [-3.0, -4.0]}},
        {"method": "sft", "beta": 0.3, "points": [{"kl": 1.5, "attribute_rate": 0.25}],
         "history": {"chosen_logp": [-3.0, -1.0]}}]}
    left, right = curves.plot_frontier(document).axes
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in left.get_lines()}
    assert lines["DPO β = 0.1"] == ([0.0, 2.5], [5.0, 40.0])  # KL against the rate in percent
    assert lines["SFT on the chosen"] == ([1.5], [25.0])
    assert lines["the shipped model"][1] == [5.0, 5.0]  # the first run's first point
    assert lines["target: 30%"][1] == [30, 30] and lines["KL of 5 nats"][0] == [5, 5]
    # the log-probabilities, smoothed by an exponential moving average of weight 0.9 from the first value
    logged = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in right.get_lines()}
    assert logged.keys() == {"DPO β = 0.1: chosen", "DPO β = 0.1: rejected", "SFT on the chosen: chosen"}
    for label, second in (("DPO β = 0.1: chosen", -2.9), ("DPO β = 0.1: rejected", -3.1), ("SFT on the chosen: chosen", -2.8)):
        steps, values = logged[label]
        assert list(steps) == [1, 2] and values == pytest.approx([-3.0, second]), label
