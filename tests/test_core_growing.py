"""Data-clocked regions (engine/core/growing.py): the append handle, the stock and demand growth policies,
growth as a migration, the declared worst case per step, policy switches bit for bit, reset, state bytes."""
import pytest
import torch

from engine.core import Clock, Horizon, Region, SessionSpec, make_plan
from engine.core.growing import DataClock, DemandGrowth, StockGrowth, data_clock, make_growing, switch_policy

PARTS, HEADS, DIM = 3, 2, 4
WORST = 5


def regions(worst: int = WORST, horizon: int = 64, dtype=torch.float32):
    clock = data_clock("tok", worst)
    shape = (PARTS, HEADS, None, DIM)
    return [Region("k", shape, clock, Horizon(horizon), dtype=dtype), Region("v", shape, clock, Horizon(horizon),
                                                                             dtype=dtype)]


def rows(g: torch.Generator, t: int):
    return [torch.randn(1, HEADS, t, DIM, generator=g) for _ in range(2)]


def forward(store, g, t):
    """What a decoder forward does: every part appends its ``t`` rows at the same length, then commit.
    Returns what each part wrote, [PARTS, HEADS, t, DIM] per region."""
    written = [[], []]
    for p in range(PARTS):
        k, v = rows(g, t)
        got_k, got_v = store.append(p, k, v)
        assert got_k.shape == (1, HEADS, store.length + t, DIM)
        assert torch.equal(got_k[:, :, store.length:], k) and torch.equal(got_v[:, :, store.length:], v)
        written[0].append(k)
        written[1].append(v)
    store.commit(t)
    return [torch.cat(w, dim=0) for w in written]


def history(store):
    c = store.contents()
    return c["k"], c["v"]


def test_data_clock_is_planned_at_its_worst_case():
    rs = regions()
    assert isinstance(rs[0].clock, DataClock) and rs[0].clock.worst == WORST
    assert make_plan(rs, SessionSpec(steps=4, prefix={"k": 2, "v": 2})).demand == {"k": 22, "v": 22}
    with pytest.raises(ValueError, match="one worst case"):
        DataClock("bad", (3, 4))


def test_growth_within_room_keeps_the_address():
    g = torch.Generator().manual_seed(0)
    s = DemandGrowth(regions(), "cpu", capacity=16, growable=True)
    addr = s.addresses()
    want = []
    for t in (5, 1, 3, 4, 2):                                # 15 rows of a 16-unit room
        s.begin_step(t)
        want.append(forward(s, g, t))
    assert s.length == 15 and s.grown == 0 and s.capacity == 16 and s.addresses() == addr
    k, v = history(s)
    assert torch.equal(k, torch.cat([w[0] for w in want], dim=2)) and torch.equal(v, torch.cat([w[1] for w in want], 2))
    assert s.view("k").data_ptr() == addr["k"]                # the history is a view of the same storage


def test_growth_past_the_room_migrates_once_and_keeps_the_contents():
    g = torch.Generator().manual_seed(1)
    s = DemandGrowth(regions(), "cpu", capacity=8, growable=True)
    forward(s, g, 7)
    before, addr = history(s), s.addresses()
    assert s.begin_step() == "needed"                        # 7 + 5 > 8: one move, to 16 units
    assert s.grown == 1 and s.capacity == 16 and s.addresses() != addr
    after = history(s)
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
    assert int((s.storage["k"][:, :, 7:] != 0).sum()) == 0   # past the history: fresh zeros
    new = forward(s, g, 5)
    k, _ = history(s)
    assert torch.equal(k[:, :, :7], before[0]) and torch.equal(k[:, :, 7:], new[0]) and s.grown == 1


def test_growing_ahead_moves_early_once_keeps_the_contents_and_stops_at_the_horizon():
    """``begin_step(ahead=k)``: a demand store grows now when the room after the step would not hold ``k`` more
    worst-case steps (a moment the caller chose), bit for bit; not when it would; never past its horizon, and
    never refusing there (only a step that does not fit refuses); the stock policy has nothing to do."""
    g = torch.Generator().manual_seed(5)
    s = DemandGrowth(regions(horizon=40), "cpu", capacity=16, growable=True)
    forward(s, g, 4)
    assert s.begin_step(ahead=1) is None                     # 4 + 5 + 5 = 14 <= 16: room enough
    assert s.grown == 0 and s.capacity == 16
    forward(s, g, 3)
    before, addr = history(s), s.addresses()
    assert s.begin_step(ahead=1) == "ahead"                  # 7 + 5 + 5 = 17 > 16: moves now, to 32
    assert s.grown == 1 and s.capacity == 32 and s.addresses() != addr
    assert all(torch.equal(a, b) for a, b in zip(history(s), before))
    new = forward(s, g, 5)
    assert torch.equal(history(s)[0][:, :, 7:], new[0])
    s.begin_step(ahead=4)                                    # 12 + 5 + 20 = 37 > 32: to the horizon, 40
    assert s.grown == 2 and s.capacity == 40
    forward(s, g, 5)
    s.begin_step(ahead=8)                                    # at the horizon: nothing more, no refusal
    assert s.grown == 2 and s.capacity == 40
    stock = StockGrowth(regions(), "cpu")
    stock.begin_step(ahead=3)
    assert stock.length == 0 and stock.state_bytes() == 0
    fixed = DemandGrowth(regions(), "cpu", capacity=8)       # not growable: ahead never moves it
    fixed.begin_step(ahead=5)
    assert fixed.grown == 0 and fixed.capacity == 8
    short = DemandGrowth(regions(), "cpu", capacity=8, growable=True)
    forward(short, g, 6)
    assert short.begin_step(ahead=2) == "needed"             # 6 + 5 > 8, and 6 + 5 + 10 = 21: one move, to 21
    assert short.grown == 1 and short.capacity == 21
    with pytest.raises(ValueError, match="steps ahead must be >= 0"):
        s.begin_step(ahead=-1)


def test_the_declared_worst_case_means_no_growth_inside_a_step():
    g = torch.Generator().manual_seed(2)
    s = DemandGrowth(regions(), "cpu", capacity=6, growable=True)
    ref = StockGrowth(regions(), "cpu")
    moves = []
    for step in range(12):
        s.begin_step()
        ref.begin_step()
        grown, addr = s.grown, s.addresses()
        sizes = [int(x) for x in torch.randint(0, 3, (3,), generator=g)]
        sizes[-1] = min(sizes[-1], WORST - sum(sizes[:-1]))
        for t in sizes:                                       # several forwards, at most the worst case in all
            seed = int(torch.randint(0, 1 << 30, (1,), generator=g))
            forward(s, torch.Generator().manual_seed(seed), t)
            forward(ref, torch.Generator().manual_seed(seed), t)
            assert s.grown == grown and s.addresses() == addr, f"step {step}: the store moved mid-step"
        moves.append(s.grown)
    assert moves[-1] >= 2 and all(b - a <= 1 for a, b in zip([0] + moves, moves))   # at most one move a step
    a, b = history(s), history(ref)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])          # both policies hold the same bits


@pytest.mark.parametrize("start", ["demand", "stock"])
def test_switching_policies_mid_session_keeps_the_contents_bit_for_bit(start):
    g = torch.Generator().manual_seed(3)
    s = make_growing(start, regions(), "cpu", capacity=32, growable=True)
    other = "stock" if start == "demand" else "demand"
    held = 0
    for kind in (other, start, other, start):
        s.begin_step()
        forward(s, g, 3)
        before = history(s)
        s = switch_policy(s, kind, capacity=4, growable=True)          # a room smaller than the history: grows
        assert s.kind == kind and s.in_step and s.length == held + 3
        got = history(s)
        assert torch.equal(got[0], before[0]) and torch.equal(got[1], before[1])
        forward(s, g, 2)                                                 # the open step goes on: 3 + 2 = its 5
        with pytest.raises(ValueError, match="declared worst case"):
            forward(s, g, 1)
        s.end_step()
        held += 5
    assert switch_policy(s, s.kind) is s


def test_reset_drops_the_history_and_keeps_the_storage():
    g = torch.Generator().manual_seed(4)
    for kind in ("demand", "stock"):
        s = make_growing(kind, regions(), "cpu", capacity=16)
        s.begin_step()
        forward(s, g, 4)
        addr = s.addresses() if kind == "demand" else None
        s.reset()
        assert s.length == 0 and history(s)[0].shape == (PARTS, HEADS, 0, DIM)
        if kind == "stock":
            assert all(t is None for t in s.parts_of["k"] + s.parts_of["v"])    # the stock drops its tensors
        new = forward(s, g, 1)                                  # the step had 1 row left after the 4
        with pytest.raises(ValueError, match="declared worst case"):
            forward(s, g, 1)
        assert torch.equal(history(s)[0], new[0]) and s.length == 1
        if kind == "demand":
            assert s.addresses() == addr                        # the same storage, written from 0 again


def test_state_bytes_count_what_each_policy_holds():
    g = torch.Generator().manual_seed(5)
    d = DemandGrowth(regions(), "cpu", capacity=10)
    s = StockGrowth(regions(), "cpu")
    assert d.state_bytes() == 2 * PARTS * HEADS * 10 * DIM * 4 and s.state_bytes() == 0
    for t in (3, 4):
        forward(d, g, t)
        forward(s, g, t)
    assert d.state_bytes() == 2 * PARTS * HEADS * 10 * DIM * 4           # preallocated: the same
    assert s.state_bytes() == 2 * PARTS * HEADS * 7 * DIM * 4            # the stock: what it holds now
    ptr = s.parts_of["k"][0].data_ptr()
    forward(s, g, 1)
    assert s.parts_of["k"][0].data_ptr() != ptr                          # the stock cats a new tensor


def test_bad_input_is_one_clear_error():
    g = torch.Generator().manual_seed(6)
    s = DemandGrowth(regions(), "cpu", capacity=8)
    s.begin_step()
    with pytest.raises(ValueError, match=r"k: appending 6 rows at 0 would hold 6 rows, past this step's declared "
                                         r"worst case of 5 rows"):
        s.append(0, *rows(g, 6))
    with pytest.raises(ValueError, match=r"append wants rows of shape \(1, 2, 2, 4\)"):
        s.append(0, torch.zeros(1, HEADS, 2, DIM), torch.zeros(1, HEADS, 2, DIM + 1))
    with pytest.raises(ValueError, match="a part in"):
        s.append(PARTS, *rows(g, 1))
    s.end_step()
    with pytest.raises(RuntimeError, match="9 positions exceed the horizon of 8"):
        s.append(0, *rows(g, 9))                                         # not growable
    grow = DemandGrowth(regions(horizon=12), "cpu", capacity=8, growable=True)
    with pytest.raises(RuntimeError, match="13 positions exceed the horizon of 12"):
        grow.begin_step(13)
    planned = Region("p", (2, None), Clock("c", (3,)), Horizon(9))
    with pytest.raises(ValueError, match="needs a DataClock"):
        StockGrowth([planned], "cpu")
    with pytest.raises(ValueError, match="unknown growth policy"):
        make_growing("padded", regions(), "cpu")


def test_a_rehearsal_writes_past_the_open_step_and_puts_the_bounds_back():
    """A graph captured ahead (and its warm-up) writes the next step's rows past this step's declared worst case:
    inside ``rehearsal`` the bounds are set aside, the storage never moves, and the step and length come back;
    the real step then writes those rows again."""
    g = torch.Generator().manual_seed(4)
    s = DemandGrowth(regions(), "cpu", capacity=32, growable=True)
    s.begin_step(2)
    forward(s, g, 2)
    addr = s.addresses()
    with pytest.raises(ValueError, match="declared worst case"):
        forward(s, g, 1)
    with s.rehearsal():
        assert not s.in_step
        forward(s, g, 4)                                     # rows 2..5: the next step's, rehearsed
        assert s.length == 6
    assert s.in_step and s.length == 2 and s.addresses() == addr and s.grown == 0
    with pytest.raises(ValueError, match="declared worst case"):
        forward(s, g, 1)
    s.begin_step(4)
    real = forward(s, g, 4)                                  # the real step overwrites what was rehearsed
    k, v = history(s)
    assert torch.equal(k[:, :, 2:6], real[0]) and torch.equal(v[:, :, 2:6], real[1])
