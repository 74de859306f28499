"""wordle (game): guess a hidden 5-letter word in 6 tries from per-letter feedback.

Guesses are typed as in AgentGym's LMRL Wordle (`s h i r e`; `shire` is accepted too) and feedback is a
letter per position: `g` right letter in the right place, `y` in the word but elsewhere, `b` not in the word
(with repeated letters counted as in the real game). Invalid words cost a round but not a guess.

The vocabulary (`data/wordle_words.txt`) is built once from Debian's `wamerican-small` word list (5 lowercase
letters, no plurals or other simple derived forms). Hidden words are the vocabulary words that the expert
solves within 6 guesses (all but the few in `data/wordle_unsolved.txt`); a hash of the word puts each in
train or eval.
The expert is a consistent-candidate solver: a fixed opener, then the remaining candidate that splits the
other candidates into the most feedback groups.

A spec task (`reset_spec`) hides any vocabulary word (`WordleEnv._reset_spec`). Wordle has no world to
explore: an exploration (`reset_world`) hides no word, accepts guesses without feedback, and yields one task
per word guessed; see `WordleEnv._reset_world`. The state key is the multiset of guesses so far (their
feedback follows from the word); the step judges' cost to go is the number of vocabulary words still consistent
with the feedback (`WordleEnv._measures`).

Rebuild the data files (never needed at run time):
  python -m evolver.envs.wordle --build /usr/share/dict/american-english-small
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import re

from evolver.envs import base

_DATA_DIR = os.path.join(os.path.dirname(__file__), "data")
_WORDS_FILE = os.path.join(_DATA_DIR, "wordle_words.txt")
_UNSOLVED_FILE = os.path.join(_DATA_DIR, "wordle_unsolved.txt")
MAX_GUESSES = 6
_EVAL_EVERY = 6


def feedback(guess: str, answer: str) -> str:
  """Per-letter feedback such as 'bygbb' (g: right place, y: elsewhere in the word, b: not in the word)."""
  marks = ["b"] * 5
  unmatched = collections.Counter()
  for i, (g, a) in enumerate(zip(guess, answer)):
    if g == a:
      marks[i] = "g"
    else:
      unmatched[a] += 1
  for i, g in enumerate(guess):
    if marks[i] == "b" and unmatched[g] > 0:
      marks[i] = "y"
      unmatched[g] -= 1
  return "".join(marks)


@functools.cache
def vocabulary() -> tuple[str, ...]:
  with open(_WORDS_FILE) as f:
    return tuple(line.strip() for line in f if line.strip())


@functools.cache
def _vocabulary_set() -> frozenset[str]:
  return frozenset(vocabulary())


@functools.cache
def answers(split: str) -> tuple[str, ...]:
  base.check_split(split)
  with open(_UNSOLVED_FILE) as f:
    unsolved = {line.strip() for line in f}
  return tuple(w for w in vocabulary() if w not in unsolved and base.split_of(w, _EVAL_EVERY) == split)


OPENER = "crate"  # the vocabulary word that splits the vocabulary into the most feedback groups


def best_guess(candidates: list[str]) -> str:
  """The candidate that splits the candidates into the most feedback groups (ties: alphabetical)."""
  if len(candidates) <= 2:
    return candidates[0]
  best, best_groups = candidates[0], -1
  for guess in candidates:
    groups = len({feedback(guess, answer) for answer in candidates})
    if groups > best_groups:
      best, best_groups = guess, groups
  return best


def _consistent(candidates, guess: str, marks: str) -> list[str]:
  return [w for w in candidates if feedback(guess, w) == marks]


@functools.lru_cache(maxsize=4096)
def _expert_guess(history: tuple[tuple[str, str], ...]) -> tuple[str, int]:
  """The expert's next guess after `history` ((guess, marks) pairs) and how many candidates remain."""
  candidates = list(vocabulary())
  for guess, marks in history:
    candidates = _consistent(candidates, guess, marks)
  if not history:
    return OPENER, len(candidates)
  if not candidates:  # Only reachable if the hidden word were outside the vocabulary.
    return OPENER, 0
  return best_guess(candidates), len(candidates)


@functools.lru_cache(maxsize=4096)
def candidates_left(history: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
  """The vocabulary words consistent with every (guess, marks) pair of `history`, in vocabulary order."""
  if not history:
    return vocabulary()
  guess, marks = history[-1]
  return tuple(_consistent(candidates_left(history[:-1]), guess, marks))


def expert_solves(answer: str) -> bool:
  history: list[tuple[str, str]] = []
  for _ in range(MAX_GUESSES):
    guess, _ = _expert_guess(tuple(history))
    marks = feedback(guess, answer)
    if marks == "ggggg":
      return True
    history.append((guess, marks))
  return False


_INSTRUCTION = f"""\
Let's play Wordle. Guess the hidden 5-letter English word in at most {MAX_GUESSES} guesses. Type a guess \
as five space-separated letters, like "s h i r e". After each guess you get one feedback letter per position:
- g: this letter is in the word, in this position
- y: this letter is in the word, but in another position
- b: this letter is not in the word (or not that many times)
Guesses must be real words; an invalid word costs a turn but not a guess.

Each turn, reply with a short thought and one action:
Thought: <your reasoning>
Action: <your guess>

Example, after "guess 1: p a n i c -> b b y b b":
Thought: The word has an n, but not in the middle, and no p, a, i or c. "l e m o n" fits.
Action: l e m o n"""

_GUESS_PATTERN = re.compile(r"[a-z]")


class WordleEnv(base.TextEnv):
  name = "wordle"
  version = "wordle-v1"
  max_rounds = 10

  def __init__(self):
    super().__init__()
    self._answer = ""
    self._history: list[tuple[str, str]] = []

  def instruction(self) -> str:
    return _INSTRUCTION

  def _num_tasks(self, split: str) -> int:
    return len(answers(split))

  def _task_key(self, index: int, split: str) -> str:
    return answers(split)[index]

  def _reset_task(self, index: int, split: str) -> str:
    self._answer = answers(split)[index]
    self._history = []
    return f"Let's start Wordle! Guess the hidden 5-letter word; you have {MAX_GUESSES} guesses."

  def _reset_spec(self, spec: base.TaskSpec) -> str:
    """Target: `{"word": w}`, the hidden word, any word of the vocabulary (the expert solves all but those in
    `data/wordle_unsolved.txt` within 6 guesses). The world plays no part: any valid world index is accepted.
    Success: guessing `w`, reward 1. The env's own goal text never shows the word; a spec's goal text is shown
    as "Your goal: <text>" before the usual first line.
    """
    base.check_target_keys(self.name, spec.target, ("word",))
    word = base.spec_str(self.name, "word", spec.target["word"])
    if word not in _vocabulary_set():
      raise base.EnvError(f"wordle spec target word {word!r:.40} is not in the vocabulary ({len(vocabulary())} "
                          "lowercase 5-letter words, data/wordle_words.txt)")
    self._answer = word
    self._history = []
    first = f"Let's start Wordle! Guess the hidden 5-letter word; you have {MAX_GUESSES} guesses."
    return f"Your goal: {spec.goal}\n{first}" if spec.goal else first

  def _reset_world(self, index: int, split: str) -> str:
    """No hidden word (the world plays no part in wordle): guesses are checked against the vocabulary, as
    usual, and answered without feedback; six valid guesses end the episode.

    Outcomes: each vocabulary word guessed, as `{"word": w}`, with the distinct words guessed up to and
    including its first guess (invalid words cost no guess and are dropped, and so are repeated guesses,
    which tell nothing new): on replay every earlier guess gets its feedback against w, and w wins.
    """
    self._answer = ""
    self._history = []
    return (f"Wordle with no hidden word: guess words to see which are in the word list; there is no secret "
            f"to find, and no feedback. You have {MAX_GUESSES} guesses.")

  def _target_key_now(self) -> str:
    return f"wordle|word={self._answer}"

  def _state_key(self) -> str:
    """The guesses so far as a sorted multiset: their order changes neither what the feedback tells nor how
    many guesses are left (the feedback follows from the guess and the task's word). Invalid words cost a
    round but no guess, so they leave the key unchanged."""
    return "guesses=" + ",".join(sorted(guess for guess, _ in self._history))

  def _measures(self) -> tuple[int, float]:
    """cost_to_go: how many vocabulary words are still consistent with all the feedback so far (the hidden word
    among them; 0 once it is guessed): a guess that rules words out lowers it, while an invalid word, a repeated
    guess or one whose feedback rules nothing out leaves it; progress: the fraction of the 5 positions whose
    letter is known, i.e. marked g in some guess so far."""
    known = {i for guess, marks in self._history for i, mark in enumerate(marks) if mark == "g"}
    return len(candidates_left(tuple(self._history))), len(known) / 5

  def _act(self, text: str) -> base.Outcome:
    raw = base.parse_action(text).lower()
    letters = raw.replace(" ", "")
    if len(letters) != 5 or not all(_GUESS_PATTERN.fullmatch(ch) for ch in letters):
      return base.Outcome(f"Invalid guess {raw[:40]!r}: type five letters separated by spaces, like "
                          f"\"s h i r e\". Guesses left: {MAX_GUESSES - len(self._history)}.", 0.0)
    if letters not in _vocabulary_set():
      return base.Outcome(f"\"{' '.join(letters)}\" is not in the word list; try another word. "
                          f"Guesses left: {MAX_GUESSES - len(self._history)}.", 0.0)
    if self._exploring:
      return self._explored(letters)
    marks = feedback(letters, self._answer)
    self._history.append((letters, marks))
    n = len(self._history)
    line = f"guess {n}: {' '.join(letters)} -> {' '.join(marks)}"
    if marks == "ggggg":
      return base.Outcome(f"{line}\nYou guessed the word. Success!", 1.0, True, True)
    if n >= MAX_GUESSES:
      return base.Outcome(f"{line}\nNo guesses left; the word was \"{' '.join(self._answer)}\".", 0.0, True)
    return base.Outcome(f"{line}\nGuesses left: {MAX_GUESSES - n}.", 0.0)

  def _explored(self, word: str) -> base.Outcome:
    """A valid guess of an exploration: no feedback; records the word (see `_reset_world`)."""
    self._history.append((word, ""))
    n = len(self._history)
    guessed = list(dict.fromkeys(guess for guess, _ in self._history))
    self._add_hindsight({"word": word}, [" ".join(w) for w in guessed[:guessed.index(word) + 1]],
                        f"guessed \"{word}\"")
    line = f"guess {n}: {' '.join(word)} is in the word list."
    if n >= MAX_GUESSES:
      return base.Outcome(f"{line}\nNo guesses left; the exploration is over.", 0.0, True)
    return base.Outcome(f"{line}\nGuesses left: {MAX_GUESSES - n}.", 0.0)

  def _expert_turn(self) -> str:
    guess, remaining = _expert_guess(tuple(self._history))
    spaced = " ".join(guess)
    if not self._history:
      thought = f"\"{spaced}\" is a good opener: common letters in different places."
    elif remaining == 1:
      thought = f"Only \"{spaced}\" fits all the feedback so far."
    else:
      thought = f"{remaining} words fit the feedback; \"{spaced}\" fits and splits them best."
    return base.react_turn(thought, spaced)

  def _sample_action(self, rng) -> str:
    return " ".join(rng.choice(vocabulary()))


# ----------------------------------------------------------------------------------------------------------
# Building the data files from a Debian word list (run once; the results are committed).
# ----------------------------------------------------------------------------------------------------------

_ROMAN = re.compile(r"^[ivxlcdm]+$")


def _is_derived(word: str, words: set[str]) -> bool:
  """Plurals, past tenses, comparatives and -ly adverbs of a shorter word in the list."""
  if word.endswith("s") and (word[:-1] in words or (word.endswith("es") and word[:-2] in words)):
    return True
  if word.endswith(("ed", "er")) and (word[:-2] in words or word[:-1] in words):
    return True
  return word.endswith("ly") and word[:-2] in words


def build_vocabulary(dictionary_path: str) -> list[str]:
  with open(dictionary_path, encoding="utf-8", errors="ignore") as f:
    words = {line.strip() for line in f}
  vocab = sorted(w for w in words if len(w) == 5 and w.isascii() and w.isalpha() and w.islower()
                 and not _ROMAN.match(w) and not _is_derived(w, words))
  return vocab


def main() -> None:
  parser = argparse.ArgumentParser(description="Rebuild the Wordle vocabulary and answer lists.")
  parser.add_argument("--build", metavar="DICTIONARY", required=True, help="a Debian /usr/share/dict list")
  args = parser.parse_args()
  vocab = build_vocabulary(args.build)
  with open(_WORDS_FILE, "w") as f:
    f.write("\n".join(vocab) + "\n")
  vocabulary.cache_clear()
  _vocabulary_set.cache_clear()
  _expert_guess.cache_clear()
  candidates_left.cache_clear()
  unsolved = [w for w in vocab if not expert_solves(w)]
  with open(_UNSOLVED_FILE, "w") as f:
    f.write("".join(w + "\n" for w in unsolved))
  print(f"{len(vocab)} words; the expert solves all but {len(unsolved)} within {MAX_GUESSES} guesses")


if __name__ == "__main__":
  main()
