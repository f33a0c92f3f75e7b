//! The sparse recording's checkpoints: which blocks of a prompt are recorded and how many
//! blocks each one credits (see the module notes of [`super`]).

/// Index of the `k`-th checkpoint: 0, 1, 3, 7, 15, 23, 31, … (then every 8th).
#[inline]
pub(super) fn checkpoint(k: usize) -> usize {
    match k {
        0 => 0,
        1 => 1,
        2 => 3,
        _ => 8 * (k - 2) - 1,
    }
}

/// Number of checkpoints below `n` blocks, counting the last block `n - 1` as one.
#[inline]
pub(super) fn checkpoints(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let last = n - 1;
    // Regular checkpoints <= last.
    let regular = match last {
        0 => 1,
        1 | 2 => 2,
        3..=6 => 3,
        _ => 3 + (last + 1) / 8,
    };
    if checkpoint(regular - 1) == last {
        regular
    } else {
        regular + 1
    }
}

/// Block index of the `k`-th of the `m` checkpoints of an `n`-block prompt.
#[inline]
pub(super) fn position(k: usize, m: usize, n: usize) -> usize {
    if k + 1 == m { n - 1 } else { checkpoint(k) }
}

/// Blocks the `k`-th of the `m` checkpoints of an `n`-block prompt credits: a regular
/// checkpoint stands for the blocks since the previous one ([`span`]); a prompt's last block,
/// when it is not a regular checkpoint, for none, because the next turn of the conversation
/// records the regular checkpoint beyond it, whose span covers it again (crediting both counted
/// up to 7 blocks twice per turn, and a conversation of 12 turns nearly twice its length).
#[inline]
pub(super) fn credit(k: usize, m: usize, n: usize) -> u8 {
    if k + 1 == m && checkpoint(k) != n - 1 {
        0
    } else {
        span(position(k, m, n))
    }
}

/// Blocks a regular checkpoint at block `p` stands for: those after the previous one.
#[inline]
pub(super) fn span(p: usize) -> u8 {
    let w = match p {
        0..=2 => 1,
        3 => 2,
        4..=7 => p - 3,
        _ => p % 8 + 1,
    };
    w as u8
}
