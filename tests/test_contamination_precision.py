"""The near-duplicate test is precise on generated tasks (boards of two symbols, generators with
several templates) and still finds the leaks it is for: an exact copy, one word or number changed
in long prose, a training prompt inside an eval prompt, a board with one cell flipped."""

import random

import pytest

from posttrain.evaluation.contamination import ContaminationConfig, check_contamination
from posttrain.values.task import Task

BOARD_INTRO = ("Find the distance to the nearest 0 for each cell of the square matrix below; answer with "
               "a matrix of the same size.\n")


def task(domain: str, i: int, split: str, prompt: str) -> Task:
    return Task(domain=domain, prompt=prompt, split=split, seed=i, env="single")


def board(rng: random.Random, size: int, p_one: float = 0.7) -> list[list[int]]:
    return [[int(rng.random() < p_one) for _ in range(size)] for _ in range(size)]


def board_text(cells: list[list[int]]) -> str:
    return BOARD_INTRO + "\n".join(" ".join(map(str, row)) for row in cells)


def board_sets(seed: int, size: int, n_train: int = 200, n_eval: int = 10):
    rng = random.Random(seed)
    train = [task("boards", i, "train", board_text(board(rng, size))) for i in range(n_train)]
    evals = [task("boards", 1000 + i, "eval", board_text(board(rng, size))) for i in range(n_eval)]
    return train, evals


def leaked(report) -> set[tuple[str, str, str]]:
    return {(m.eval_key, m.field, m.kind) for m in report.matches}


def test_distinct_boards_of_two_symbols_are_not_near_duplicates():
    # 5-character shingles of a 0/1 board are a dozen patterns shared by every board: the guard
    # used to call any two boards near-duplicates
    for size in (5, 8, 16):
        train, evals = board_sets(size, size)
        report = check_contamination(train, evals)
        assert report.ok, (size, report.matches[:3])


def test_a_copied_board_is_found_and_a_flipped_cell_on_a_large_board_too():
    rng = random.Random(7)
    for size in (8, 16):
        train, evals = board_sets(size, size)
        train.append(task("boards", 900, "train", evals[0].prompt))            # an exact copy
        flipped = [row[:] for row in map(list, _cells(evals[1].prompt))]
        i, j = rng.randrange(size), rng.randrange(size)
        flipped[i][j] = 1 - flipped[i][j]
        train.append(task("boards", 901, "train", board_text(flipped)))         # one cell changed
        found = leaked(check_contamination(train, evals))
        assert (evals[0].key, "problem", "exact") in found
        # a near-duplicate board is one where the changed cells are a small share of the board:
        # one cell of 256 is; one of 64 is another problem (its 20-character shingles, ten
        # cells each, are a third changed)
        assert ((evals[1].key, "prompt", "near") in found) == (size == 16), size
        assert {key for key, _, _ in found} <= {evals[0].key, evals[1].key}


def _cells(prompt: str) -> list[list[int]]:
    return [[int(c) for c in line.split()] for line in prompt.splitlines()[1:]]


def test_a_board_inside_an_eval_prompt_with_text_around_it_is_found():
    train, evals = board_sets(3, 16)
    copied = task("boards", 1100, "eval", "Take your time. " + train[5].prompt + "\nShow your work.")
    report = check_contamination(train, evals + [copied])
    assert leaked(report) == {(copied.key, "prompt", "near")}


# A generator with three templates, none in half of its tasks (reasoning-gym's aiw): the template
# text used to stay in the compared shingles, so two problems of one template looked alike.
TEMPLATES = (
    "{a} has {x} brothers and she also has {y} sisters. How many sisters does {a}'s brother have? "
    "Count {a} herself, and answer with one number.",
    "{a} has {x} male friends and {y} female friends. They are all friends with each other, and "
    "{b} has no other friends. How many female friends does {b}, a male friend of {a}, have?",
    "{a} and {b} share a flat with {x} cats and {y} dogs. Each of {a}'s cats is friendly with each "
    "of {b}'s dogs. How many friendly pairs of a cat and a dog live in the flat?",
)
NAMES = ("Alice", "Bob", "Carol", "David", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory",
         "Niaj", "Olivia", "Peggy", "Rupert", "Sybil", "Trent", "Victor", "Walter", "Yvonne")


def templated(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    return rng.choice(TEMPLATES).format(a=a, b=b, x=rng.randint(1, 9), y=rng.randint(1, 9))


def test_two_problems_of_one_template_are_not_near_duplicates_but_a_copy_is():
    rng = random.Random(11)
    train = [task("aiw", i, "train", templated(rng)) for i in range(200)]
    evals = [task("aiw", 1000 + i, "eval", templated(rng)) for i in range(40)]
    evals = [e for e in evals if all(e.prompt != t.prompt for t in train)]  # the space is small
    assert check_contamination(train, evals).ok
    train.append(task("aiw", 900, "train", evals[0].prompt))
    found = leaked(check_contamination(train, evals))
    assert (evals[0].key, "problem", "exact") in found and {key for key, _, _ in found} == {evals[0].key}


# Long prose: words drawn from a large vocabulary, a shared instruction in front (a template)
_vocab = random.Random(42)
WORDS = ["".join(_vocab.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_vocab.randint(3, 9)))
         for _ in range(3000)]
INSTRUCTION = "Read the story and answer the question at its end with one number. "


def story(rng: random.Random, n: int = 80) -> list[str]:
    words = [rng.choice(WORDS) for _ in range(n)]
    words[n // 2] = str(rng.randint(100, 999))
    return words


def prose_sets(seed: int):
    rng = random.Random(seed)
    stories = [story(rng) for _ in range(210)]
    train = [task("prose", i, "train", INSTRUCTION + " ".join(w)) for i, w in enumerate(stories[:200])]
    evals = [task("prose", 1000 + i, "eval", INSTRUCTION + " ".join(w)) for i, w in enumerate(stories[200:])]
    return train, evals, stories[200:]


def test_one_word_or_number_changed_in_long_prose_is_found():
    train, evals, words = prose_sets(5)
    assert check_contamination(train, evals).ok
    one_word = list(words[0])
    one_word[10] = "zebra"
    one_number = list(words[1])
    one_number[40] = str(int(one_number[40]) + 1)
    train += [task("prose", 900, "train", INSTRUCTION + " ".join(one_word)),
              task("prose", 901, "train", INSTRUCTION + " ".join(one_number))]
    found = leaked(check_contamination(train, evals))
    assert found == {(evals[0].key, "prompt", "near"), (evals[1].key, "prompt", "near")}


def test_a_training_prompt_inside_an_eval_prompt_is_found():
    train, evals, _ = prose_sets(6)
    copied = task("prose", 1100, "eval", "Here is a puzzle from a book. " + train[3].prompt + " Think step by step.")
    report = check_contamination(train, evals + [copied])
    assert leaked(report) == {(copied.key, "prompt", "near")}


def test_differing_template_text_is_a_difference():
    # statements in a few wordings each: two tasks that share five rare ones and differ in two
    # common ones (template text, in more than 5% of the tasks) are two problems; with the
    # template left out of both sides they would look identical (similarity 1.0)
    rng = random.Random(9)

    def statements(values: list[int]) -> str:
        return "How many solutions? " + " ".join(
            f"Statement {k + 1}: 'at least {v} of these statements are true.'" for k, v in enumerate(values))

    def draw() -> list[int]:
        return [rng.randint(1, 60) for _ in range(5)] + [rng.randint(1, 3) for _ in range(2)]

    train = [task("self", i, "train", statements(draw())) for i in range(200)]
    near = [int(v) for v in train[0].prompt.split("at least ")[1:] for v in [v.split()[0]]]
    near[5], near[6] = near[5] % 3 + 1, near[6] % 3 + 1
    evals = [task("self", 1000, "eval", statements(near))]
    assert check_contamination(train, evals).ok


@pytest.mark.parametrize("bad", [{"long_ngrams": ()}, {"long_ngrams": (5,)}, {"template_min_count": 2},
                                 {"template_df_low": 0.6}, {"informative_share": 0}, {"min_informative": 0}])
def test_config_refuses_settings_that_would_hide_leaks(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ContaminationConfig(**bad)
