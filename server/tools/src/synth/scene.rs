//! The scene an image of the generated dataset shows (see the module docs of `synth`): palette,
//! value-noise texture, shapes with soft edges, vignette and sensor noise, rendered to RGB8.

use super::SynthSpec;

/// Buffers reused from one image to the next by a worker.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) rgb: Vec<f32>,
    pub(super) tex: Vec<f32>,
    pub(super) hue: Vec<f32>,
    pub(super) pixels: Vec<u8>,
    pub(super) jpeg: Vec<u8>,
}
/// SplitMix64: tiny, fast, and stable forever (unlike a library's default generator).
struct Rng(u64);

impl Rng {
    fn new(parts: &[u64]) -> Rng {
        let mut r = Rng(0x6A09_E667_F3BC_C908);
        for p in parts {
            r.0 ^= *p;
            r.next();
        }
        r
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }

    fn below(&mut self, n: u32) -> u32 {
        (((self.next() >> 32) * u64::from(n)) >> 32) as u32
    }
}

/// HSV (all in `[0, 1]`) to linear-ish RGB in `[0, 255]`.
fn hsv(h: f32, s: f32, v: f32) -> [f32; 3] {
    let h = h.rem_euclid(1.0) * 6.0;
    let i = h.floor();
    let f = h - i;
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f)));
    let (r, g, b) = match i as u32 {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    };
    [r * 255.0, g * 255.0, b * 255.0]
}

/// A class's look: a base hue, how colourful, and which shapes it favours.
struct Palette {
    hue: f32,
    spread: f32,
    saturation: f32,
    /// Weights of ellipse, polygon, stripes.
    shapes: [f32; 3],
}

impl Palette {
    fn of(seed: u64, class: u32) -> Palette {
        let mut r = Rng::new(&[seed, 0xC1A55, u64::from(class)]);
        Palette {
            // Golden-ratio steps keep neighbouring classes' hues apart.
            hue: (class as f32 * 0.618_034 + r.range(0.0, 0.1)).fract(),
            spread: r.range(0.05, 0.3),
            saturation: r.range(0.25, 0.75),
            shapes: [r.range(0.2, 1.0), r.range(0.2, 1.0), r.range(0.1, 0.6)],
        }
    }

    fn colour(&self, r: &mut Rng) -> [f32; 3] {
        let h = self.hue + r.range(-self.spread, self.spread);
        let s = (self.saturation + r.range(-0.2, 0.2)).clamp(0.05, 1.0);
        hsv(h, s, r.range(0.25, 0.95))
    }

    fn shape(&self, r: &mut Rng) -> u32 {
        let total: f32 = self.shapes.iter().sum();
        let mut x = r.range(0.0, total);
        for (i, w) in self.shapes.iter().enumerate() {
            if x < *w {
                return i as u32;
            }
            x -= w;
        }
        0
    }
}

/// Adds `amp ×` value noise of cell size `cell` (smoothstep-interpolated lattice) to `out`
/// (`w × h`, row-major).
fn add_value_noise(out: &mut [f32], w: usize, h: usize, cell: f32, amp: f32, r: &mut Rng) {
    let gw = (w as f32 / cell) as usize + 2;
    let gh = (h as f32 / cell) as usize + 2;
    let lattice: Vec<f32> = (0..gw * gh).map(|_| r.range(-amp, amp)).collect();
    let smooth = |t: f32| t * t * (3.0 - 2.0 * t);
    // Column positions are the same for every row.
    let cols: Vec<(usize, f32)> = (0..w)
        .map(|x| {
            let g = x as f32 / cell;
            (g as usize, smooth(g.fract()))
        })
        .collect();
    for (y, row) in out.chunks_exact_mut(w).take(h).enumerate() {
        let g = y as f32 / cell;
        let (iy, fy) = (g as usize, smooth(g.fract()));
        let top = &lattice[iy * gw..(iy + 1) * gw];
        let bottom = &lattice[(iy + 1) * gw..(iy + 2) * gw];
        for (v, &(ix, fx)) in row.iter_mut().zip(&cols) {
            let a = top[ix] + (top[ix + 1] - top[ix]) * fx;
            let b = bottom[ix] + (bottom[ix + 1] - bottom[ix]) * fx;
            *v += a + (b - a) * fy;
        }
    }
}

/// Multi-octave value noise, octaves from `largest` cells down to `smallest`.
fn fbm(out: &mut Vec<f32>, w: usize, h: usize, cells: (f32, f32), gain: f32, r: &mut Rng) {
    out.clear();
    out.resize(w * h, 0.0);
    let (mut cell, mut amp) = (cells.0, 1.0);
    while cell >= cells.1 {
        add_value_noise(out, w, h, cell, amp, r);
        cell /= 2.0;
        amp *= gain;
    }
}

/// A convex region with a soft edge: signed distance (negative inside) at a point.
enum Region {
    Ellipse {
        cx: f32,
        cy: f32,
        rx: f32,
        ry: f32,
        cos: f32,
        sin: f32,
    },
    /// Edges as `(nx, ny, c)` with `n·p - c` the signed distance to the edge line.
    Polygon(Vec<(f32, f32, f32)>),
}

impl Region {
    fn distance(&self, x: f32, y: f32) -> f32 {
        match self {
            Region::Ellipse {
                cx,
                cy,
                rx,
                ry,
                cos,
                sin,
            } => {
                let (dx, dy) = (x - cx, y - cy);
                let (u, v) = (dx * cos + dy * sin, -dx * sin + dy * cos);
                let q = ((u / rx) * (u / rx) + (v / ry) * (v / ry)).sqrt();
                (q - 1.0) * rx.min(*ry)
            }
            Region::Polygon(edges) => edges
                .iter()
                .map(|(nx, ny, c)| nx * x + ny * y - c)
                .fold(f32::MIN, f32::max),
        }
    }
}

/// A convex polygon through the given points (in angular order around their centre).
fn polygon(points: &[(f32, f32)]) -> Region {
    let n = points.len() as f32;
    let cx = points.iter().map(|p| p.0).sum::<f32>() / n;
    let cy = points.iter().map(|p| p.1).sum::<f32>() / n;
    let mut edges = Vec::with_capacity(points.len());
    for (i, &(x0, y0)) in points.iter().enumerate() {
        let (x1, y1) = points[(i + 1) % points.len()];
        let (ex, ey) = (x1 - x0, y1 - y0);
        let len = (ex * ex + ey * ey).sqrt().max(1e-3);
        let (mut nx, mut ny) = (ey / len, -ex / len);
        // Outward normal: away from the centre.
        if nx * (cx - x0) + ny * (cy - y0) > 0.0 {
            nx = -nx;
            ny = -ny;
        }
        edges.push((nx, ny, nx * x0 + ny * y0));
    }
    Region::Polygon(edges)
}

/// How a shape's inside is painted.
enum Pattern {
    Plain,
    /// Two colours alternating along a direction.
    Stripes {
        freq: f32,
        dir: (f32, f32),
    },
    /// Wavy lines bent by the texture (wood, fur, ripples).
    Grain {
        freq: f32,
        dir: (f32, f32),
        bend: f32,
    },
}

/// One shape of a scene.
struct Shape {
    region: Region,
    /// Pixel bounds `(x0, y0, x1, y1)`, clipped later.
    bounds: (f32, f32, f32, f32),
    centre: (f32, f32),
    colour: [f32; 3],
    second: [f32; 3],
    pattern: Pattern,
    /// Light direction divided by the shape's size, and shading strength.
    light: (f32, f32),
    shade: f32,
    /// Texture contrast inside the shape.
    contrast: f32,
}

impl Shape {
    fn random(
        palette: &Palette,
        scale: f32,
        (wf, hf): (f32, f32),
        texture: f32,
        r: &mut Rng,
    ) -> Shape {
        use std::f32::consts::{PI, TAU};
        let colour = palette.colour(r);
        let second = palette.colour(r);
        let (cx, cy) = (r.range(0.0, wf), r.range(0.0, hf));
        let kind = palette.shape(r);
        let (region, bounds) = if kind == 0 {
            let a = r.range(0.0, PI);
            let (rx, ry) = (scale, scale * r.range(0.3, 1.0));
            let region = Region::Ellipse {
                cx,
                cy,
                rx,
                ry,
                cos: a.cos(),
                sin: a.sin(),
            };
            (region, (cx - rx, cy - rx, cx + rx, cy + rx))
        } else {
            let n = if kind == 1 { 3 + r.below(5) } else { 4 };
            let start = r.range(0.0, TAU);
            let stretch = if kind == 2 { r.range(1.5, 3.0) } else { 1.0 };
            let (sin, cos) = r.range(0.0, PI).sin_cos();
            let points: Vec<(f32, f32)> = (0..n)
                .map(|k| {
                    let a = start + TAU * (k as f32 + r.range(-0.3, 0.3)) / n as f32;
                    let rad = scale * r.range(0.6, 1.0);
                    let (u, v) = (a.cos() * rad * stretch, a.sin() * rad);
                    (cx + u * cos - v * sin, cy + u * sin + v * cos)
                })
                .collect();
            let bounds = points.iter().fold(
                (f32::MAX, f32::MAX, f32::MIN, f32::MIN),
                |(x0, y0, x1, y1), &(x, y)| (x0.min(x), y0.min(y), x1.max(x), y1.max(y)),
            );
            (polygon(&points), bounds)
        };
        let (dsin, dcos) = r.range(0.0, PI).sin_cos();
        let pattern = match (kind, r.below(3)) {
            (2, _) => Pattern::Stripes {
                freq: r.range(0.15, 0.6),
                dir: (dcos, dsin),
            },
            (_, 0) => Pattern::Grain {
                freq: r.range(0.3, 1.2),
                dir: (dcos, dsin),
                bend: r.range(2.0, 8.0),
            },
            _ => Pattern::Plain,
        };
        let light = r.range(0.0, TAU);
        Shape {
            region,
            bounds,
            centre: (cx, cy),
            colour,
            second,
            pattern,
            light: (light.cos() / scale, light.sin() / scale),
            shade: r.range(0.15, 0.45),
            contrast: r.range(0.5, 2.0) * texture,
        }
    }

    fn draw(&self, rgb: &mut [f32], tex: &[f32], w: usize, h: usize) {
        let (bx0, by0, bx1, by1) = self.bounds;
        let x0 = (bx0 - 1.0).max(0.0) as usize;
        let y0 = (by0 - 1.0).max(0.0) as usize;
        let x1 = ((bx1 + 2.0).max(0.0) as usize).min(w);
        let y1 = ((by1 + 2.0).max(0.0) as usize).min(h);
        let (cx, cy) = self.centre;
        for y in y0..y1 {
            for x in x0..x1 {
                let (px, py) = (x as f32 + 0.5, y as f32 + 0.5);
                let d = self.region.distance(px, py);
                if d >= 1.0 {
                    continue;
                }
                let alpha = (0.5 - d * 0.5).clamp(0.0, 1.0);
                let i = y * w + x;
                let t = tex[i];
                let lit = 1.0
                    + self.shade
                        * ((px - cx) * self.light.0 + (py - cy) * self.light.1).clamp(-1.0, 1.0);
                let base = match self.pattern {
                    Pattern::Plain => self.colour,
                    Pattern::Stripes { freq, dir } => {
                        if ((px * dir.0 + py * dir.1) * freq).sin() > 0.0 {
                            self.second
                        } else {
                            self.colour
                        }
                    }
                    Pattern::Grain { freq, dir, bend } => {
                        let k = 0.5 + 0.5 * ((px * dir.0 + py * dir.1) * freq + t * bend).sin();
                        let mut c = self.colour;
                        for (c, s) in c.iter_mut().zip(self.second) {
                            *c += (s - *c) * k * 0.6;
                        }
                        c
                    }
                };
                let p = &mut rgb[i * 3..i * 3 + 3];
                for (c, b) in p.iter_mut().zip(base) {
                    let v = b * lit + t * self.contrast;
                    *c += (v - *c) * alpha;
                }
            }
        }
    }
}

/// Renders one image into `scratch.pixels` (RGB8).
pub(super) fn render(spec: &SynthSpec, class: u32, index: u32, scratch: &mut Scratch) {
    let (w, h) = (spec.width as usize, spec.height as usize);
    let (wf, hf) = (w as f32, h as f32);
    let size = wf.min(hf);
    let palette = Palette::of(spec.seed, class);
    let mut r = Rng::new(&[spec.seed, u64::from(class), u64::from(index)]);

    let busy = r.range(0.65, 0.85);
    fbm(&mut scratch.tex, w, h, (size / 3.0, 2.0), busy, &mut r);
    fbm(&mut scratch.hue, w, h, (size / 1.5, 16.0), 0.4, &mut r);

    // Background: a gradient along a random direction between two palette colours.
    let (c0, c1) = (palette.colour(&mut r), palette.colour(&mut r));
    let angle = r.range(0.0, std::f32::consts::TAU);
    let (gx, gy) = (angle.cos() / wf, angle.sin() / hf);
    let texture = r.range(25.0, 55.0);
    let tint = r.range(10.0, 30.0);
    // Contour lines of the texture (like foliage, rock or bark): edges at all scales.
    let (ridges, ridge_bend) = (r.range(15.0, 45.0), r.range(4.0, 12.0));
    let rgb = &mut scratch.rgb;
    rgb.clear();
    rgb.resize(w * h * 3, 0.0);
    for y in 0..h {
        for x in 0..w {
            let i = y * w + x;
            let t = (0.5 + (x as f32 - wf / 2.0) * gx + (y as f32 - hf / 2.0) * gy).clamp(0.0, 1.0);
            let ridge = ((scratch.tex[i] * ridge_bend).sin().abs() - 0.5) * ridges;
            let (tex, hue) = (scratch.tex[i] * texture + ridge, scratch.hue[i] * tint);
            let p = &mut rgb[i * 3..i * 3 + 3];
            p[0] = c0[0] + (c1[0] - c0[0]) * t + tex + hue;
            p[1] = c0[1] + (c1[1] - c0[1]) * t + tex;
            p[2] = c0[2] + (c1[2] - c0[2]) * t + tex - hue;
        }
    }

    // Large shapes, then small clutter, back to front.
    let large = 3 + r.below(6);
    let small = 10 + r.below(30);
    for k in 0..large + small {
        let scale = if k < large {
            size * r.range(0.08, 0.35)
        } else {
            size * r.range(0.015, 0.07)
        };
        let shape = Shape::random(&palette, scale, (wf, hf), texture, &mut r);
        shape.draw(rgb, &scratch.tex, w, h);
    }

    // Vignette, sensor noise (triangular, about ±`grain`), quantization.
    let grain = r.range(9.0, 14.0);
    let vignette = r.range(0.1, 0.35);
    let mut noise = Rng::new(&[spec.seed, u64::from(class), u64::from(index), 0x6E015E]);
    scratch.pixels.clear();
    scratch.pixels.reserve(w * h * 3);
    for y in 0..h {
        let dy = (y as f32 - hf / 2.0) / hf;
        for x in 0..w {
            let dx = (x as f32 - wf / 2.0) / wf;
            let v = 1.0 - vignette * (dx * dx + dy * dy) * 2.0;
            let bits = noise.next();
            let i = (y * w + x) * 3;
            for c in 0..3 {
                let b = bits >> (c * 20);
                let n = ((b & 0x3FF) as f32 + ((b >> 10) & 0x3FF) as f32) / 1023.0 - 1.0;
                let val = rgb[i + c] * v + n * grain;
                scratch.pixels.push(val.clamp(0.0, 255.0) as u8);
            }
        }
    }
}
