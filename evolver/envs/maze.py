"""maze (game): walk a grid maze to the goal with `move up|down|left|right`.

Mazes are carved by a randomised depth-first search on a grid of cells, then a few extra walls are knocked
out so that some mazes have loops; sizes range from 7x7 to 9x11 blocks. The first observation draws the map;
each step says where the agent is and which ways are open. The expert walks a shortest path (BFS).

A spec task (`reset_spec`) keeps a task's map and start and asks for another open cell; see
`MazeEnv._reset_spec`. An exploration (`reset_world`) walks the map with no goal and yields one task per
cell reached; see `MazeEnv._reset_world`. The state key is the agent's position; the step judges' cost to go is
the shortest-path distance to the goal (`MazeEnv._measures`).
"""

from __future__ import annotations

import collections
import dataclasses
import random

from evolver.envs import base

_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_MIN_PATH, _MAX_PATH = 4, 14  # shortest start -> goal distance, in moves


@dataclasses.dataclass(frozen=True)
class MazeTask:
  rows: tuple[str, ...]  # '#' wall, '.' open
  start: tuple[int, int]  # (row, column)
  goal: tuple[int, int] | None  # None in an exploration

  def is_open(self, cell: tuple[int, int]) -> bool:
    r, c = cell
    return 0 <= r < len(self.rows) and 0 <= c < len(self.rows[0]) and self.rows[r][c] == "."


def _carve(rng: random.Random, cell_rows: int, cell_cols: int) -> list[list[str]]:
  height, width = 2 * cell_rows + 1, 2 * cell_cols + 1
  grid = [["#"] * width for _ in range(height)]
  stack = [(0, 0)]
  visited = {(0, 0)}
  grid[1][1] = "."
  while stack:
    r, c = stack[-1]
    neighbours = [(r + dr, c + dc) for dr, dc in _MOVES.values()
                  if 0 <= r + dr < cell_rows and 0 <= c + dc < cell_cols and (r + dr, c + dc) not in visited]
    if not neighbours:
      stack.pop()
      continue
    nr, nc = rng.choice(neighbours)
    grid[r + nr + 1][c + nc + 1] = "."  # the wall between the two cells
    grid[2 * nr + 1][2 * nc + 1] = "."
    visited.add((nr, nc))
    stack.append((nr, nc))
  # Knock out a few interior walls between two open blocks: loops, so not every maze is a tree.
  for _ in range(rng.randint(0, 3)):
    candidates = [(r, c) for r in range(1, height - 1) for c in range(1, width - 1) if grid[r][c] == "#" and (
        (grid[r - 1][c] == "." and grid[r + 1][c] == "." and grid[r][c - 1] == "#" and grid[r][c + 1] == "#") or
        (grid[r][c - 1] == "." and grid[r][c + 1] == "." and grid[r - 1][c] == "#" and grid[r + 1][c] == "#"))]
    if candidates:
      r, c = rng.choice(candidates)
      grid[r][c] = "."
  return grid


def _distances(task_rows: tuple[str, ...], source: tuple[int, int]) -> dict[tuple[int, int], int]:
  probe = MazeTask(task_rows, source, source)
  dist = {source: 0}
  queue = collections.deque([source])
  while queue:
    r, c = queue.popleft()
    for dr, dc in _MOVES.values():
      nxt = (r + dr, c + dc)
      if nxt not in dist and probe.is_open(nxt):
        dist[nxt] = dist[(r, c)] + 1
        queue.append(nxt)
  return dist


def generate_task(seed: int) -> MazeTask | None:
  rng = random.Random(f"maze:{seed}")
  grid = _carve(rng, rng.randint(3, 4), rng.randint(3, 5))
  rows = tuple("".join(row) for row in grid)
  open_cells = [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "."]
  start = rng.choice(open_cells)
  dist = _distances(rows, start)
  goals = [cell for cell, d in dist.items() if _MIN_PATH <= d <= _MAX_PATH]
  if not goals:
    return None
  return MazeTask(rows, start, rng.choice(sorted(goals)))


def _task_key(task: MazeTask) -> str:
  return "/".join(task.rows) + f"|{task.start}|{task.goal}"


_TASKS = base.SplitIndex(generate_task, _task_key, sizes={"train": 2000, "eval": 200}, eval_every=5)

_INSTRUCTION = """\
You are in a grid maze and must reach the goal. The map uses # for walls and . for open squares; S marks \
your start and G the goal. Positions are (row, column), counted from 0 at the top-left corner.

Each turn, reply with a short thought and one action:
Thought: <your reasoning>
Action: <one action>

Actions:
- move up: row - 1
- move down: row + 1
- move left: column - 1
- move right: column + 1

You cannot walk through walls. You win when you stand on the goal.

Example:
Thought: The goal is below me and the way down is open.
Action: move down"""


class MazeEnv(base.TextEnv):
  name = "maze"
  version = "maze-v1"
  max_rounds = 24

  def __init__(self):
    super().__init__()
    self._task: MazeTask | None = None
    self._position = (0, 0)
    self._goal_text: str | None = None  # a spec's own goal text, shown instead of the goal's position
    self._path: list[tuple[tuple[int, int], str]] = []  # exploration: (cell, move into it) from the start, loops cut
    self._to_goal: dict[tuple[int, int], int] | None = None  # moves from each open cell to the goal, once needed

  def instruction(self) -> str:
    return _INSTRUCTION

  def _num_tasks(self, split: str) -> int:
    return _TASKS.sizes[split]

  def _task_key(self, index: int, split: str) -> str:
    return _TASKS.key(index, split)

  def _reset_task(self, index: int, split: str) -> str:
    return self._start(_TASKS.get(index, split), None)

  def _reset_spec(self, spec: base.TaskSpec) -> str:
    """Target: `{"cell": [row, col]}`, an open cell of the world's map, reachable from the world's start (which
    stays) within `max_rounds` moves, other than the start. Success: standing on that cell, reward 1.

    With an empty `spec.goal` the map marks the cell G and every observation gives its position, as for an
    indexed task; with a goal text, the map has no G, the observation says "Goal: <text>" and steps say only
    where the agent is, so the text alone tells which cell is meant.
    """
    base.check_target_keys(self.name, spec.target, ("cell",))
    world = _TASKS.get(spec.world, spec.split)
    cell = spec.target["cell"]
    if not isinstance(cell, list) or len(cell) != 2:
      raise base.EnvError(f"maze spec target 'cell' must be [row, column], got {cell!r:.60}")
    row = base.spec_int(self.name, "cell[0] (row)", cell[0], 0, len(world.rows) - 1)
    column = base.spec_int(self.name, "cell[1] (column)", cell[1], 0, len(world.rows[0]) - 1)
    goal = (row, column)
    if not world.is_open(goal):
      raise base.EnvError(f"maze spec target cell {goal} is a wall of world {spec.split}[{spec.world}]")
    if goal == world.start:
      raise base.EnvError(f"maze spec target cell {goal} is the start: there would be nothing to do")
    distance = _distances(world.rows, world.start).get(goal)
    if distance is None:
      raise base.EnvError(f"maze spec target cell {goal} cannot be reached from the start {world.start}")
    if distance > self.max_rounds:
      raise base.EnvError(f"maze spec target cell {goal} is {distance} moves from the start, more than an "
                          f"episode's {self.max_rounds} rounds")
    return self._start(dataclasses.replace(world, goal=goal), spec.goal or None)

  def _reset_world(self, index: int, split: str) -> str:
    """The world's map with its start S and no goal (no G, no goal position in any observation).

    Outcomes: each cell reached for the first time, other than the start, within `max_rounds` moves of it,
    as `{"cell": [row, col]}` with the moves of the walk that reached it, loops cut out (a walk back onto a cell
    of the path shortens the path to it), so the moves form a simple path from the start. Walls bumped into
    and unknown actions move nothing and are dropped.
    """
    self._path = []
    return self._start(dataclasses.replace(_TASKS.get(index, split), goal=None), None)

  def _target_key_now(self) -> str:
    world = base.stable_digest("/".join(self._task.rows) + f"|{self._task.start}")
    return f"maze|world={world}|cell={self._task.goal[0]},{self._task.goal[1]}"

  def _start(self, task: MazeTask, goal_text: str | None) -> str:
    self._task = task
    self._position = task.start
    self._goal_text = goal_text
    self._to_goal = None
    drawn = [list(row) for row in task.rows]
    drawn[task.start[0]][task.start[1]] = "S"
    if goal_text is None and task.goal is not None:
      drawn[task.goal[0]][task.goal[1]] = "G"
    picture = "\n".join("".join(row) for row in drawn)
    if goal_text is None:
      return f"Map:\n{picture}\n{self._where()}"
    return f"Map:\n{picture}\nGoal: {goal_text}\n{self._where()}"

  def _open_moves(self) -> list[str]:
    r, c = self._position
    return [name for name, (dr, dc) in _MOVES.items() if self._task.is_open((r + dr, c + dc))]

  def _where(self) -> str:
    if self._goal_text is not None or self._task.goal is None:
      return f"You are at {self._position}. Open: {', '.join(self._open_moves())}."
    return (f"You are at {self._position}; the goal is at {self._task.goal}. "
            f"Open: {', '.join(self._open_moves())}.")

  def _state_key(self) -> str:
    """The agent's position: the map, start and goal belong to the task."""
    return f"at={self._position[0]},{self._position[1]}"

  def _measures(self) -> tuple[int, float]:
    """cost_to_go: the shortest-path distance (BFS over open cells, in moves) from the agent to the goal, what
    the expert walks; progress: 1 - that distance / the start's distance."""
    if self._to_goal is None:
      self._to_goal = _distances(self._task.rows, self._task.goal)
    distance = self._to_goal[self._position]
    return distance, 1.0 - distance / self._to_goal[self._task.start]

  def _act(self, text: str) -> base.Outcome:
    action = base.parse_action(text).lower()
    direction = action.removeprefix("move").strip()
    if direction not in _MOVES:
      return base.Outcome(f"Unknown action {action[:60]!r}. Use one of: move up, move down, move left, "
                          f"move right. {self._where()}", 0.0)
    dr, dc = _MOVES[direction]
    target = (self._position[0] + dr, self._position[1] + dc)
    if not self._task.is_open(target):
      return base.Outcome(f"A wall blocks {direction}; you stay put. {self._where()}", 0.0)
    self._position = target
    if self._exploring:
      self._explored(target, direction)
    if target == self._task.goal:
      return base.Outcome(f"You moved {direction} and reached the goal at {target}. Success!", 1.0, True, True)
    return base.Outcome(f"You moved {direction}. {self._where()}", 0.0)

  def _explored(self, cell: tuple[int, int], direction: str) -> None:
    """Extends the exploration's path to `cell` (cutting the loop when the path already holds it) and records
    a cell reached for the first time."""
    cells = [c for c, _ in self._path]
    if cell == self._task.start:
      self._path = []
    elif cell in cells:
      del self._path[cells.index(cell) + 1:]
    else:
      self._path.append((cell, direction))
      if len(self._path) <= self.max_rounds:
        self._add_hindsight({"cell": list(cell)}, [f"move {move}" for _, move in self._path], f"reached cell {cell}")

  def _expert_turn(self) -> str:
    if self._position == self._task.goal:
      return base.react_turn("I am on the goal already.", "move up")
    dist = _distances(self._task.rows, self._task.goal)
    r, c = self._position
    best = min((dist.get((r + dr, c + dc), 10**9), name) for name, (dr, dc) in _MOVES.items())
    steps = best[0] + 1
    return base.react_turn(f"The goal at {self._task.goal} is {steps} moves away; the shortest path goes "
                           f"{best[1]}.", f"move {best[1]}")

  def _sample_action(self, rng) -> str:
    return f"move {rng.choice(list(_MOVES))}"
