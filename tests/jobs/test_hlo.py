# ruff: noqa: E501  (HLO instructions are one line each)
"""Reading collectives from optimized HLO text (spec_jax/jobs/hlo.py): only the decode
loop body's (not the prefill's query-block loop before it), followed into called
computations and both branches, async starts counted once with their output's bytes,
nested loops by their trip count."""

from spec_jax.jobs import hlo

TEXT = """HloModule jit_decode_loop, entry_computation_layout={(f32[8,128]{1,0})->f32[8,128]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(f32[] %x, f32[] %y)
}

%branch_a (p: f32[8,128]) -> f32[8,128] {
  %p = f32[8,128]{1,0:T(8,128)} parameter(0)
  ROOT %all-reduce.3 = f32[8,128]{1,0:T(8,128)} all-reduce(%p), channel_id=3, to_apply=%add
}

%branch_b (p: f32[8,128]) -> f32[8,128] {
  ROOT %p = f32[8,128]{1,0} parameter(0)
}

%inner_body (t: (s32[], bf16[4,64])) -> (s32[], bf16[4,64]) {
  %t = (s32[], bf16[4,64]{1,0}) parameter(0)
  %g = bf16[4,64]{1,0} get-tuple-element(%t), index=1
  %cp = bf16[4,64]{1,0} collective-permute(%g), channel_id=5, source_target_pairs={{0,1},{1,0}}
  ROOT %r = (s32[], bf16[4,64]{1,0}) tuple(%i, %cp)
}

%inner_cond (t: (s32[], bf16[4,64])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

%body (s: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {
  %s = (s32[], f32[8,128]{1,0}) parameter(0)
  %v = f32[8,128]{1,0} get-tuple-element(%s), index=1
  %ags = (f32[8,64]{1,0}, f32[8,128]{1,0}) all-gather-start(%h), channel_id=1, dimensions={1}
  %agd = f32[8,128]{1,0} all-gather-done(%ags)
  %cond = f32[8,128]{1,0} conditional(%i, %v, %v), branch_computations={%branch_a, %branch_b}
  %loop = (s32[], bf16[4,64]{1,0}) while(%t0), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %out = (s32[], f32[8,128]{1,0}) tuple(%i, %agd)
}

%cond (s: (s32[], f32[8,128])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

%prefill_block (q: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {
  %q = (s32[], f32[8,128]{1,0}) parameter(0)
  %qv = f32[8,128]{1,0} get-tuple-element(%q), index=1
  %ata = f32[8,128]{1,0} all-to-all(%qv), channel_id=11, dimensions={0}
  ROOT %qr = (s32[], f32[8,128]{1,0}) tuple(%i, %ata)
}

ENTRY %main (a: f32[8,128]) -> f32[8,128] {
  %a = f32[8,128]{1,0} parameter(0)
  %before = f32[8,128]{1,0} all-reduce(%a), channel_id=9, to_apply=%add
  %pre = (s32[], f32[8,128]{1,0}) while(%init0), condition=%cond, body=%prefill_block, backend_config={"known_trip_count":{"n":"4"}}
  %w = (s32[], f32[8,128]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %res = f32[8,128]{1,0} get-tuple-element(%w), index=1
}
"""


def test_loop_collectives_follow_the_decode_loop_body_only():
    assert hlo.while_bodies(TEXT) == ['prefill_block', 'body']
    assert hlo.decode_loop_body(TEXT) == 'body'  # The loop without a known trip count.
    got = hlo.loop_collectives(TEXT)
    assert got == {
        'all-gather': dict(count=1, bytes=8 * 128 * 4),  # The gathered output, once.
        'all-reduce': dict(count=1, bytes=8 * 128 * 4),  # Branch a (an upper bound).
        'collective-permute': dict(count=3, bytes=3 * 4 * 64 * 2),  # Trip count 3.
    }
    # The all-reduce before the loop and the prefill's all-to-all (4 blocks) are the entry's,
    # not a round's.
    entry = hlo.collectives(TEXT, hlo.computations(TEXT)[1])
    assert entry['all-reduce']['count'] == 2 and entry['all-to-all']['count'] == 4
    # Without trip counts, the decode loop is the largest body.
    bare = TEXT.replace(', backend_config={"known_trip_count":{"n":"4"}}', '')
    assert hlo.decode_loop_body(bare) == 'body' and hlo.loop_collectives(bare) == got
    assert hlo.loop_collectives('HloModule m\n') == {}


def test_array_bytes_of_tuples_and_layouts():
    assert hlo.array_bytes('(f32[8,64]{1,0:T(8,128)}, bf16[2,3]{1,0})') == 8 * 64 * 4 + 12
    assert hlo.array_bytes('(f32[8,64]{1,0}, f32[8,128]{1,0})', largest=True) == 8 * 128 * 4
    assert hlo.array_bytes('pred[]') == 1
