//! The register tile of a vectorised reduction: how many rows of the output, by how many
//! elements of its vector axis, one micro-kernel keeps in accumulator registers.
//!
//! The tile is chosen by a small throughput model rather than by a preference list, because
//! a preference list fails on extents with few divisors: a ResNet stage-4 convolution has 7
//! pixels in a row, the list's 6, 5, 4, 3, 2 rows do not divide it, and the old choice fell
//! to one row by two vectors. Two accumulators wait on the multiply-add's latency, and that
//! kernel ran at a quarter of onnxruntime's speed on AVX2 (`harl-bench models --only
//! resnet_s4`).

use crate::target::CpuTarget;

/// Multiply-adds a core issues per cycle (two FMA pipes on every x86 core harl targets).
const FMA_PIPES: f64 = 2.0;
/// Loads a core issues per cycle: a broadcast of the row operand and a vector of the other
/// operand are each one load.
const LOAD_PORTS: f64 = 2.0;
/// Cycles from one multiply-add to the next on the same accumulator.
const FMA_LATENCY: f64 = 4.0;
/// The level-1 data cache a tile's vector operand should fit in for the whole reduction it
/// runs (32 KiB on every x86 core harl targets).
const L1_BYTES: usize = 32 * 1024;
/// Bytes a cycle the level-2 cache sustains into level 1: a vector operand that does not fit
/// in L1 is read from L2 at this rate (a 1 x 8-vector tile over a 512-long reduction,
/// 128 KB of filters, waited on L2 rather than on its multiply-adds).
const L2_BYTES_PER_CYCLE: f64 = 24.0;
/// The most rows a tile unrolls (the code grows with rows x vectors).
const MAX_ROWS: usize = 8;

/// A register tile: `rows` rows of the row axis by `width` elements of the vector axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterTile {
    /// Rows of the row axis (each broadcast once a reduction step).
    pub rows: usize,
    /// Elements of the vector axis (loaded once a reduction step, `width / lanes` vectors).
    pub width: usize,
}

/// What a register tile is chosen for: the extents it must divide, the reduction it runs
/// inside the tile, and the element and vector sizes.
#[derive(Clone, Copy, Debug)]
pub struct TileProblem {
    /// Extent of the vectorised axis.
    pub vec_extent: usize,
    /// Extent of the row axis.
    pub row_extent: usize,
    /// Reduction steps the tile runs while its vector operand stays in cache (a cache block).
    pub reduction: usize,
    /// Bytes of one element.
    pub elem_bytes: usize,
}

/// Useful multiply-add lanes a cycle, in vectors, of a `rows` x `width` tile: a reduction step
/// issues `rows x vectors` multiply-adds and `rows + vectors` loads, no accumulator can take
/// its next multiply-add before the last one's latency has passed, and a vector operand larger
/// than L1 over the tile's reduction streams from L2.
pub fn throughput(p: &TileProblem, target: &CpuTarget, rows: usize, width: usize) -> f64 {
    let lanes = lanes(p, target);
    let vectors = width.div_ceil(lanes);
    let fmas = (rows * vectors) as f64;
    let loads = (rows + vectors) as f64;
    let panel = p
        .reduction
        .saturating_mul(width)
        .saturating_mul(p.elem_bytes);
    let l2 = if panel > L1_BYTES {
        (vectors * target.vector_bytes) as f64 / L2_BYTES_PER_CYCLE
    } else {
        0.0
    };
    let cycles = (fmas / FMA_PIPES)
        .max(loads / LOAD_PORTS)
        .max(FMA_LATENCY)
        .max(l2);
    (rows * width) as f64 / lanes as f64 / cycles
}

fn lanes(p: &TileProblem, target: &CpuTarget) -> usize {
    (target.vector_bytes / p.elem_bytes.max(1)).max(1)
}

/// The register tile for problem `p`: both sides divide their extents, at most the target's
/// accumulator registers, the highest [`throughput`]. Ties go to the width earliest in 2, 1,
/// 4, 3 vectors, then to the rows earliest in 6, 8, 4, 7, 5, 3, 2, 1 (the preference lists
/// this model replaced), so that shapes where those lists already reach the best throughput
/// keep their tiles.
pub fn choose(p: &TileProblem, target: &CpuTarget) -> RegisterTile {
    let lanes = lanes(p, target);
    let regs = target.acc_registers.max(1);
    let width_rank = |w: usize| {
        [2, 1, 4, 3]
            .iter()
            .position(|&v| v * lanes == w)
            .unwrap_or(usize::MAX)
    };
    let row_rank = |r: usize| {
        [6, 8, 4, 7, 5, 3, 2, 1]
            .iter()
            .position(|&x| x == r)
            .unwrap_or(usize::MAX)
    };
    let mut best = RegisterTile { rows: 1, width: 1 };
    let mut best_key = (f64::MIN, usize::MAX, usize::MAX);
    for width in divisors(p.vec_extent, regs * lanes) {
        for rows in divisors(p.row_extent, MAX_ROWS) {
            if rows * width.div_ceil(lanes) > regs {
                continue;
            }
            let key = (
                throughput(p, target, rows, width),
                width_rank(width),
                row_rank(rows),
            );
            let tie = (key.0 - best_key.0).abs() <= 1e-9;
            if key.0 > best_key.0 + 1e-9 || (tie && (key.1, key.2) < (best_key.1, best_key.2)) {
                best = RegisterTile { rows, width };
                best_key = key;
            }
        }
    }
    best
}

/// The register tile for `p` with rows from a second axis of `other_extent` beside the row
/// axis (a convolution's output rows beside its row of pixels): `(tile, rows2)`, the tile
/// taking `tile.rows` rows of the row axis times `rows2` of the other. The rows of both axes
/// are each one broadcast a reduction step, as one axis's are, so the model rates the tile by
/// its row count; the second axis is used only where that beats [`choose`]'s one-axis tile
/// (`rows2 = 1` otherwise). A 14-pixel row has no 4-row tile: 7 rows of one vector keep 7
/// accumulators, fewer than the multiply-add's latency needs, while 2 x 2 pixels by 2 vectors
/// keep 8 and ran 1.12x faster (ResNet-50's 3x3 convolution at 14x14, 256 filters, Zen 3,
/// 1 thread, `harl-bench probe --against`; 80.5 -> 90.3 GFLOP/s).
pub fn choose_block(
    p: &TileProblem,
    other_extent: usize,
    target: &CpuTarget,
) -> (RegisterTile, usize) {
    let lanes = lanes(p, target);
    let regs = target.acc_registers.max(1);
    let one = choose(p, target);
    let mut best = (one, 1);
    let mut best_speed = throughput(p, target, one.rows, one.width);
    for rows2 in divisors(other_extent, MAX_ROWS)
        .into_iter()
        .filter(|&r| r > 1)
    {
        for width in divisors(p.vec_extent, regs * lanes) {
            for rows in divisors(p.row_extent, MAX_ROWS / rows2) {
                let all = rows * rows2;
                if all * width.div_ceil(lanes) > regs {
                    continue;
                }
                let speed = throughput(p, target, all, width);
                if speed > best_speed + 1e-9 {
                    best = (RegisterTile { rows, width }, rows2);
                    best_speed = speed;
                }
            }
        }
    }
    best
}

/// Vector registers a panel tile keeps for other values than its accumulators: its vector
/// operands (up to two vectors at the widest ties) and one broadcast, and one to spare.
const PANEL_TILE_RESERVED: usize = 4;

/// The register tile of a 1x1 convolution's filter tile (a layout without a window): the
/// filters are the vector, read from a weight panel that streams through once for every row
/// tile, and each row is one broadcast of the activation. Only the broadcast and the panel's
/// vectors live beside the accumulators, so the tile may fill the register file (28 of
/// AVX-512's 32), rows as many as fit; among tiles of the model's best [`throughput`], the one
/// of [`choose`]'s width with the most rows wins where the panel does not stay in L1 (each
/// panel read then feeds more multiply-adds). ResNet-50's 1x1 convolutions at 14x14 took 7 or
/// 4 pixels x 2 vectors and ran at 91-111 GFLOP/s; 14 pixels x 2 vectors ran at 121-138; 7
/// pixels x 4 vectors (as many accumulators, as few rows) ran 4-9% slower than 4 x 2; with a
/// 64-long reduction (an 8 KB panel) 14 rows ran 15% slower than 8 (AVX-512, 1 thread,
/// `harl-bench probe --against`, 2026-12-05). A window (a 3x3
/// convolution's taps) keeps more values live: 14 x 2 vectors spilled there and ran at 0.6x,
/// so windowed tiles keep [`choose`]. A plain tile without a window takes this tile only where
/// the model rates it strictly faster (`default_schedule::plan_tiles`).
pub fn choose_panel_tile(p: &TileProblem, target: &CpuTarget) -> RegisterTile {
    let lanes = lanes(p, target);
    let regs = target
        .vector_registers
        .saturating_sub(PANEL_TILE_RESERVED)
        .max(target.acc_registers)
        .max(1);
    let base = choose(p, target);
    // With no registers beyond `choose`'s budget (AVX2's 16) its tile stands: larger tiles
    // were measured only where the register file has room (AVX-512).
    if regs <= target.acc_registers {
        return base;
    }
    // The panel shares L1 with the activations its rows read along the reduction and with the
    // output: past a quarter of it (an 8 KB panel gained nothing from more rows, a 16 KB one
    // did), each row tile reads it again from further out.
    let streamed = p
        .reduction
        .saturating_mul(base.width)
        .saturating_mul(p.elem_bytes)
        > L1_BYTES / 4;
    // A width of whole vectors: MobileNet-V2's 24 filters (a vector and a half) ran 6% slower
    // with 14 rows than with 8.
    let whole = base.width.is_multiple_of(lanes);
    let mut best = base;
    let mut best_key = (throughput(p, target, best.rows, best.width), best.rows);
    for width in divisors(p.vec_extent, regs * lanes) {
        for rows in divisors(p.row_extent, regs) {
            if rows * width.div_ceil(lanes) > regs {
                continue;
            }
            let speed = throughput(p, target, rows, width);
            // At the same throughput, more rows of `choose`'s width, where its panel does not
            // stay in L1 between row tiles.
            let tie = (speed - best_key.0).abs() <= 1e-9;
            let more_rows = tie && rows > best_key.1 && width == base.width && whole && streamed;
            if speed > best_key.0 + 1e-9 || more_rows {
                best = RegisterTile { rows, width };
                best_key = (speed, rows);
            }
        }
    }
    best
}

/// The divisors of `n` that are at most `cap`, ascending (1 at least).
fn divisors(n: usize, cap: usize) -> Vec<usize> {
    let d: Vec<usize> = (1..=cap.min(n)).filter(|d| n.is_multiple_of(*d)).collect();
    if d.is_empty() {
        vec![1]
    } else {
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AVX2: CpuTarget = CpuTarget {
        vector_bytes: 32,
        acc_registers: 12,
        vector_registers: 16,
        threads: 1,
    };
    const AVX512: CpuTarget = CpuTarget {
        vector_bytes: 64,
        acc_registers: 16,
        vector_registers: 32,
        threads: 1,
    };

    fn problem(vec_extent: usize, row_extent: usize, reduction: usize) -> TileProblem {
        TileProblem {
            vec_extent,
            row_extent,
            reduction,
            elem_bytes: 4,
        }
    }

    #[test]
    fn a_fourteen_pixel_row_takes_two_rows_of_two_pixels() {
        // ResNet stage 3 (256 filters, 3x3 over 256 channels, 14x14): no 4-row tile divides
        // 14, so one axis gives 7 pixels by one vector; two rows of two pixels by two vectors
        // keep 8 accumulators.
        let p = problem(256, 14, 2304);
        let (tile, rows2) = choose_block(&p, 14, &AVX2);
        assert_eq!((tile, rows2), (RegisterTile { rows: 2, width: 16 }, 2));
        assert!(throughput(&p, &AVX2, 4, 16) > throughput(&p, &AVX2, 7, 8));
        // Where the row axis has a good tile of its own, or the other axis no useful rows,
        // the one-axis tile stands.
        let p = problem(128, 28, 1152);
        assert_eq!(choose_block(&p, 28, &AVX2), (choose(&p, &AVX2), 1));
        let p = problem(512, 7, 4608);
        assert_eq!(choose_block(&p, 7, &AVX2), (choose(&p, &AVX2), 1));
        assert_eq!(choose_block(&problem(256, 14, 2304), 1, &AVX2).1, 1);
    }

    #[test]
    fn a_row_of_seven_pixels_is_tiled_whole_on_avx2() {
        // ResNet stage 4: 512 filters as the vector, 7 pixels as rows, 12 accumulators.
        let p = problem(512, 7, 4608);
        assert_eq!(choose(&p, &AVX2), RegisterTile { rows: 7, width: 8 });
        assert!(throughput(&p, &AVX2, 7, 8) > 3.0 * throughput(&p, &AVX2, 1, 16));
    }

    #[test]
    fn a_wide_tile_that_streams_from_l2_loses() {
        // A 1x1 convolution's 512-long reduction: a 1 x 64 tile reads 128 KB of filters.
        let p = problem(2048, 7, 512);
        assert_eq!(choose(&p, &AVX2), RegisterTile { rows: 7, width: 8 });
    }

    #[test]
    fn square_gemms_keep_their_tiles() {
        // The old preference lists' choices, at the model's best throughput.
        assert_eq!(
            choose(&problem(512, 512, 256), &AVX2),
            RegisterTile { rows: 4, width: 16 }
        );
        assert_eq!(
            choose(&problem(512, 512, 256), &AVX512),
            RegisterTile { rows: 8, width: 32 }
        );
        assert_eq!(
            choose(&problem(768, 384, 256), &AVX512),
            RegisterTile { rows: 6, width: 32 }
        );
    }

    #[test]
    fn a_prime_row_extent_widens_the_vector() {
        // 197 tokens and a short reduction: one row, as wide as the registers allow.
        let t = choose(&problem(768, 197, 64), &AVX2);
        assert_eq!(t.rows, 1);
        assert!(t.width >= 64, "{t:?}");
    }

    #[test]
    fn a_panel_tile_takes_more_rows_where_the_registers_allow() {
        // ResNet-50's 1x1 convolution at 14x14: 196 pixels as rows, 1024 filters as the vector.
        let p = problem(1024, 196, 256);
        assert_eq!(choose(&p, &AVX512), RegisterTile { rows: 4, width: 32 });
        assert_eq!(
            choose_panel_tile(&p, &AVX512),
            RegisterTile {
                rows: 14,
                width: 32
            }
        );
        // 49 pixels: no row count between 7 and 49 divides them, and more vectors with as few
        // rows is no better, so the tile stays.
        let p = problem(2048, 49, 512);
        assert_eq!(choose_panel_tile(&p, &AVX512), choose(&p, &AVX512));
        // A 64-long reduction's panel (8 KB) stays in L1: more rows gain nothing.
        let p = problem(64, 56, 64);
        assert_eq!(choose_panel_tile(&p, &AVX512), choose(&p, &AVX512));
        // One vector is all that divides 784 pixels: 16 filters a tile beat 8.
        let p = problem(784, 128, 256);
        assert_eq!(choose(&p, &AVX512), RegisterTile { rows: 8, width: 16 });
        assert_eq!(
            choose_panel_tile(&p, &AVX512),
            RegisterTile {
                rows: 16,
                width: 16
            }
        );
        // AVX2's 16 registers leave no room beyond `choose`'s budget.
        for p in [
            problem(1024, 196, 256),
            problem(784, 96, 256),
            problem(56, 192, 512),
        ] {
            assert_eq!(choose_panel_tile(&p, &AVX2), choose(&p, &AVX2));
        }
    }

    #[test]
    fn every_choice_divides_and_fits() {
        for vec in [1, 3, 7, 8, 16, 24, 49, 96, 197, 512, 1000] {
            for row in [1, 2, 7, 9, 49, 56, 197, 512] {
                for target in [AVX2, AVX512] {
                    let t = choose(&problem(vec, row, 256), &target);
                    let lanes = target.vector_bytes / 4;
                    assert!(vec % t.width == 0 && row % t.rows == 0, "{vec} {row} {t:?}");
                    assert!(t.rows * t.width.div_ceil(lanes) <= target.acc_registers);
                    let t = choose_panel_tile(&problem(vec, row, 256), &target);
                    assert!(vec % t.width == 0 && row % t.rows == 0, "{vec} {row} {t:?}");
                    let budget =
                        (target.vector_registers - PANEL_TILE_RESERVED).max(target.acc_registers);
                    assert!(t.rows * t.width.div_ceil(lanes) <= budget, "{t:?}");
                }
            }
        }
    }
}
