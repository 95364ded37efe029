//! Cartesian process topologies (MPI-1.2 §6.5), in rsmpi's shape: a communicator whose ranks
//! are the cells of a grid, numbered row-major (the last dimension varies fastest).
//!
//! With `reorder`, processes are placed on the grid with the meta computer in mind: the
//! members are taken site by site and machine by machine and dealt onto the grid in slabs
//! across its longest dimension, so that the grid edges between sites (wide-area links) and
//! between machines are few; the placement is kept only where it cuts fewer of them than the
//! identity does (sites first, then machines).

use std::sync::Arc;

use super::sealed::AsHandle;
use super::{
    sealed, AsCommunicator, Color, CommInner, Communicator, CommunicatorHandle, SimpleCommunicator,
};
use crate::error::{Error, ErrorClass};
use crate::{Count, Rank};

/// The grid of a Cartesian communicator and this process's place on it (`MPI_Cart_get`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CartesianLayout {
    /// Extent of each dimension.
    pub dims: Vec<Count>,
    /// Whether each dimension wraps around.
    pub periods: Vec<bool>,
    /// This process's coordinates.
    pub coords: Vec<Count>,
}

/// A grid: extents and periodicity, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Grid {
    dims: Vec<Count>,
    periods: Vec<bool>,
}

impl Grid {
    /// A grid for a communicator of `size` processes.
    pub(crate) fn new(dims: &[Count], periods: &[bool], size: Rank) -> Result<Grid, Error> {
        if dims.len() != periods.len() {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "{} dimensions but {} periodicity flags",
                    dims.len(),
                    periods.len()
                ),
            ));
        }
        if let Some((d, &n)) = dims.iter().enumerate().find(|(_, &n)| n <= 0) {
            return Err(Error::new(
                ErrorClass::Dims,
                format!("dimension {d} has extent {n}; extents must be positive"),
            ));
        }
        let cells = dims.iter().try_fold(1i64, |p, &n| p.checked_mul(n as i64));
        match cells {
            Some(c) if c <= size as i64 => Ok(Grid {
                dims: dims.to_vec(),
                periods: periods.to_vec(),
            }),
            _ => Err(Error::new(
                ErrorClass::Arg,
                format!("a grid of {dims:?} has more cells than the {size} processes"),
            )),
        }
    }

    pub(crate) fn cells(&self) -> usize {
        self.dims.iter().map(|&n| n as usize).product()
    }

    fn ndims(&self) -> usize {
        self.dims.len()
    }

    /// Coordinates of cell `rank` (row-major).
    fn coords_of(&self, rank: usize) -> Vec<Count> {
        let mut c = vec![0; self.ndims()];
        let mut r = rank;
        for d in (0..self.ndims()).rev() {
            let n = self.dims[d] as usize;
            c[d] = (r % n) as Count;
            r /= n;
        }
        c
    }

    /// The cell at `coords`; periodic dimensions wrap, others must be in range.
    fn rank_of(&self, coords: &[Count]) -> Result<Rank, Error> {
        if coords.len() != self.ndims() {
            return Err(Error::new(
                ErrorClass::Dims,
                format!(
                    "{} coordinates for a grid of {} dimensions",
                    coords.len(),
                    self.ndims()
                ),
            ));
        }
        let mut r = 0i64;
        for (d, &x) in coords.iter().enumerate() {
            let n = self.dims[d];
            let x = if self.periods[d] {
                x.rem_euclid(n)
            } else if (0..n).contains(&x) {
                x
            } else {
                return Err(Error::new(
                    ErrorClass::Arg,
                    format!("coordinate {x} is outside non-periodic dimension {d} of extent {n}"),
                ));
            };
            r = r * n as i64 + x as i64;
        }
        Ok(r as Rank)
    }

    /// The cell `disp` steps from `coords` along `dim`, if there is one.
    fn step(&self, coords: &[Count], dim: usize, disp: Count) -> Option<Rank> {
        let mut c = coords.to_vec();
        let x = c[dim] as i64 + disp as i64;
        let n = self.dims[dim] as i64;
        c[dim] = if self.periods[dim] {
            x.rem_euclid(n) as Count
        } else if (0..n).contains(&x) {
            x as Count
        } else {
            return None;
        };
        self.rank_of(&c).ok()
    }

    /// Which member (index into `places`, each member's (site, machine)) takes each cell,
    /// as `MPI_Cart_map` with reordering allowed.
    fn place(&self, places: &[(usize, usize)]) -> Vec<usize> {
        let cells = self.cells();
        let identity: Vec<usize> = (0..cells).collect();
        // Members site by site, machine by machine (stable: rank order within one).
        let mut order: Vec<usize> = (0..places.len()).collect();
        order.sort_by_key(|&m| places[m]);
        // Cells with the longest dimension varying slowest (ties: the earlier one).
        let mut dims_by_size: Vec<usize> = (0..self.ndims()).collect();
        dims_by_size.sort_by_key(|&d| std::cmp::Reverse(self.dims[d]));
        let mut slabs = vec![0usize; cells];
        let mut c = vec![0 as Count; self.ndims()];
        for (k, member) in order.iter().take(cells).enumerate() {
            let mut r = k;
            for &d in dims_by_size.iter().rev() {
                let n = self.dims[d] as usize;
                c[d] = (r % n) as Count;
                r /= n;
            }
            let cell = self.rank_of(&c).unwrap_or(0) as usize;
            slabs[cell] = *member;
        }
        if self.cut(&slabs, places) < self.cut(&identity, places) {
            slabs
        } else {
            identity
        }
    }

    /// The cost of the grid edges a placement puts between sites (weighted by the number
    /// of edges, so one more inter-site edge outweighs any number of inter-machine ones)
    /// and between machines.
    fn cut(&self, member_of: &[usize], places: &[(usize, usize)]) -> (usize, usize) {
        let (mut sites, mut machines) = (0, 0);
        for cell in 0..member_of.len() {
            let coords = self.coords_of(cell);
            for d in 0..self.ndims() {
                let Some(next) = self.step(&coords, d, 1) else {
                    continue;
                };
                let (a, b) = (places[member_of[cell]], places[member_of[next as usize]]);
                if a.0 != b.0 {
                    sites += 1;
                } else if a.1 != b.1 {
                    machines += 1;
                }
            }
        }
        (sites, machines)
    }
}

/// Each member's (site, machine) of `comm`, machines numbered by first appearance.
/// A communicator with processes of another world (see `CommInner::mixed`)
/// counts one site, and one machine per member.
fn places(comm: &CommInner) -> Vec<(usize, usize)> {
    if comm.mixed {
        return (0..comm.ranks.len()).map(|i| (0, i)).collect();
    }
    let mut names: Vec<&str> = Vec::new();
    comm.ranks
        .iter()
        .map(|&w| {
            let name = comm.node_of(w).unwrap_or_default();
            let machine = names.iter().position(|&n| n == name).unwrap_or_else(|| {
                names.push(name);
                names.len() - 1
            });
            (super::site_of_world(w), machine)
        })
        .collect()
}

/// The members (indices into `comm`'s ranks) that take each cell of `grid`.
pub(crate) fn members_of_cells(comm: &CommInner, grid: &Grid, reorder: bool) -> Vec<usize> {
    if reorder {
        grid.place(&places(comm))
    } else {
        (0..grid.cells()).collect()
    }
}

/// Fills the zero entries of `dims` so that the product of all is `nnodes`, as evenly as
/// possible and in non-increasing order (`MPI_Dims_create`). Entries already set are kept.
///
/// # Errors
/// `Dims` for a negative entry, `Arg` for a negative `nnodes` or one the set entries do not
/// divide.
pub fn dims_create(nnodes: Count, dims: &mut [Count]) -> Result<(), Error> {
    if nnodes < 0 {
        return Err(Error::new(ErrorClass::Arg, format!("{nnodes} processes")));
    }
    if let Some(&n) = dims.iter().find(|&&n| n < 0) {
        return Err(Error::new(
            ErrorClass::Dims,
            format!("extent {n}; extents must be 0 (free) or positive"),
        ));
    }
    let fixed: i64 = dims.iter().filter(|&&n| n > 0).map(|&n| n as i64).product();
    let free: Vec<usize> = (0..dims.len()).filter(|&d| dims[d] == 0).collect();
    if nnodes as i64 % fixed != 0 || (free.is_empty() && fixed != nnodes as i64) {
        return Err(Error::new(
            ErrorClass::Arg,
            format!("the set extents {dims:?} do not divide {nnodes} processes"),
        ));
    }
    if free.is_empty() {
        return Ok(());
    }
    let mut left = nnodes as i64 / fixed;
    let mut primes = Vec::new();
    let mut p = 2;
    while p * p <= left {
        while left % p == 0 {
            primes.push(p);
            left /= p;
        }
        p += 1;
    }
    if left > 1 {
        primes.push(left);
    }
    // Largest factors first, each onto the free dimension with the smallest product so far.
    let mut ext = vec![1i64; free.len()];
    for &f in primes.iter().rev() {
        if let Some(k) = (0..ext.len()).min_by_key(|&k| ext[k]) {
            ext[k] *= f;
        }
    }
    ext.sort_unstable_by(|a, b| b.cmp(a));
    for (&d, &n) in free.iter().zip(&ext) {
        dims[d] = n as Count;
    }
    Ok(())
}

/// A communicator whose ranks are the cells of a grid (`MPI_Cart_create`).
pub struct CartesianCommunicator(pub(crate) SimpleCommunicator, pub(crate) Arc<Grid>);

impl CartesianCommunicator {
    /// Makes the communicator of `members` (the parent's ranks, one per cell) on a fresh
    /// context `ctx`; `None` for a process without a cell.
    pub(crate) fn make(
        parent: &CommInner,
        ctx: u32,
        grid: Grid,
        members: &[usize],
        name: String,
    ) -> Option<CartesianCommunicator> {
        let ranks = members.iter().map(|&m| parent.ranks[m]).collect();
        let grid = Arc::new(grid);
        let inner = CommInner::new(ctx, ranks, name)?;
        // A fresh communicator: nobody else can have set its grid.
        let _ = inner.grid.set(Arc::clone(&grid));
        Some(CartesianCommunicator(
            SimpleCommunicator(CommunicatorHandle(inner)),
            grid,
        ))
    }

    /// Number of dimensions (`MPI_Cartdim_get`).
    pub fn num_dimensions(&self) -> Count {
        self.1.ndims() as Count
    }

    /// The grid and this process's coordinates (`MPI_Cart_get`).
    pub fn get_layout(&self) -> CartesianLayout {
        CartesianLayout {
            dims: self.1.dims.clone(),
            periods: self.1.periods.clone(),
            coords: self.1.coords_of(self.rank() as usize),
        }
    }

    /// As [`CartesianCommunicator::get_layout`], into slices of `num_dimensions()` entries.
    ///
    /// # Panics
    /// If a slice has another length.
    pub fn get_layout_into(&self, dims: &mut [Count], periods: &mut [bool], coords: &mut [Count]) {
        let l = self.get_layout();
        dims.copy_from_slice(&l.dims);
        periods.copy_from_slice(&l.periods);
        coords.copy_from_slice(&l.coords);
    }

    /// The rank at `coords` (`MPI_Cart_rank`); periodic dimensions wrap.
    ///
    /// # Panics
    /// On a coordinate outside a non-periodic dimension, or the wrong number of them; see
    /// [`CartesianCommunicator::try_coordinates_to_rank`].
    pub fn coordinates_to_rank(&self, coords: &[Count]) -> Rank {
        self.try_coordinates_to_rank(coords)
            .unwrap_or_else(|e| panic!("coordinates_to_rank: {e}"))
    }

    /// As [`CartesianCommunicator::coordinates_to_rank`].
    ///
    /// # Errors
    /// `Dims` for the wrong number of coordinates, `Arg` for one outside a non-periodic
    /// dimension.
    pub fn try_coordinates_to_rank(&self, coords: &[Count]) -> Result<Rank, Error> {
        self.1.rank_of(coords)
    }

    /// The coordinates of `rank` (`MPI_Cart_coords`).
    ///
    /// # Panics
    /// For a rank outside the communicator; see
    /// [`CartesianCommunicator::try_rank_to_coordinates`].
    pub fn rank_to_coordinates(&self, rank: Rank) -> Vec<Count> {
        self.try_rank_to_coordinates(rank)
            .unwrap_or_else(|e| panic!("rank_to_coordinates: {e}"))
    }

    /// As [`CartesianCommunicator::rank_to_coordinates`], into `num_dimensions()` entries.
    ///
    /// # Panics
    /// For a rank outside the communicator or a slice of another length.
    pub fn rank_to_coordinates_into(&self, rank: Rank, coords: &mut [Count]) {
        coords.copy_from_slice(&self.rank_to_coordinates(rank));
    }

    /// As [`CartesianCommunicator::rank_to_coordinates`].
    ///
    /// # Errors
    /// `Rank` for a rank outside the communicator.
    pub fn try_rank_to_coordinates(&self, rank: Rank) -> Result<Vec<Count>, Error> {
        self.as_handle().0.world_of(rank)?;
        Ok(self.1.coords_of(rank as usize))
    }

    /// The ranks `displacement` steps behind and ahead of this process along `dimension`
    /// (`MPI_Cart_shift`): receive from the first, send to the second; `None` past the end
    /// of a non-periodic dimension (`MPI_PROC_NULL`).
    ///
    /// # Panics
    /// For a dimension the grid does not have; see [`CartesianCommunicator::try_shift`].
    pub fn shift(&self, dimension: Count, displacement: Count) -> (Option<Rank>, Option<Rank>) {
        self.try_shift(dimension, displacement)
            .unwrap_or_else(|e| panic!("shift: {e}"))
    }

    /// As [`CartesianCommunicator::shift`].
    ///
    /// # Errors
    /// `Dims` for a dimension the grid does not have.
    pub fn try_shift(
        &self,
        dimension: Count,
        displacement: Count,
    ) -> Result<(Option<Rank>, Option<Rank>), Error> {
        let d = usize::try_from(dimension)
            .ok()
            .filter(|&d| d < self.1.ndims())
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::Dims,
                    format!(
                        "dimension {dimension} of a grid of {} dimensions",
                        self.1.ndims()
                    ),
                )
            })?;
        let me = self.1.coords_of(self.rank() as usize);
        Ok((
            self.1.step(&me, d, displacement.wrapping_neg()),
            self.1.step(&me, d, displacement),
        ))
    }

    /// The grids of the dimensions `retain` keeps, one per position along the others, each a
    /// Cartesian communicator of its own (`MPI_Cart_sub`; collective).
    ///
    /// # Panics
    /// If `retain` does not have one entry per dimension; see
    /// [`CartesianCommunicator::try_subgroup`].
    pub fn subgroup(&self, retain: &[bool]) -> CartesianCommunicator {
        self.try_subgroup(retain)
            .unwrap_or_else(|e| panic!("subgroup: {e}"))
    }

    /// As [`CartesianCommunicator::subgroup`].
    ///
    /// # Errors
    /// `Dims` if `retain` does not have one entry per dimension (then nobody's call
    /// communicates, so all must get it wrong alike).
    pub fn try_subgroup(&self, retain: &[bool]) -> Result<CartesianCommunicator, Error> {
        let g = &self.1;
        if retain.len() != g.ndims() {
            return Err(Error::new(
                ErrorClass::Dims,
                format!(
                    "{} flags for a grid of {} dimensions",
                    retain.len(),
                    g.ndims()
                ),
            ));
        }
        let coords = g.coords_of(self.rank() as usize);
        // Colour: the position along the dropped dimensions; key: along the kept ones.
        let (mut color, mut key) = (0i64, 0i64);
        let (mut dims, mut periods) = (Vec::new(), Vec::new());
        for d in 0..g.ndims() {
            if retain[d] {
                key = key * g.dims[d] as i64 + coords[d] as i64;
                dims.push(g.dims[d]);
                periods.push(g.periods[d]);
            } else {
                color = color * g.dims[d] as i64 + coords[d] as i64;
            }
        }
        let sub = self
            .0
            .split_by_color_with_key(Color::with_value(color as i32), key as i32)
            .expect("every member has a colour");
        let grid = Grid::new(&dims, &periods, sub.size())?;
        let grid = Arc::new(grid);
        let _ = sub.as_handle().0.grid.set(Arc::clone(&grid));
        Ok(CartesianCommunicator(sub, grid))
    }
}

impl sealed::AsHandle for CartesianCommunicator {
    fn as_handle(&self) -> &CommunicatorHandle {
        self.0.as_handle()
    }
}

impl Communicator for CartesianCommunicator {}

impl AsCommunicator for CartesianCommunicator {
    type Out = CartesianCommunicator;
    fn as_communicator(&self) -> &CartesianCommunicator {
        self
    }
}

impl std::fmt::Debug for CartesianCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CartesianCommunicator")
            .field("rank", &self.rank())
            .field("dims", &self.1.dims)
            .field("periods", &self.1.periods)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_create_spreads_factors_evenly() {
        let run = |n, d: &[Count]| {
            let mut d = d.to_vec();
            dims_create(n, &mut d).map(|_| d)
        };
        assert_eq!(run(6, &[0, 0]).unwrap(), [3, 2]);
        assert_eq!(run(7, &[0, 0]).unwrap(), [7, 1]);
        assert_eq!(run(12, &[0, 0, 0]).unwrap(), [3, 2, 2]);
        assert_eq!(run(16, &[0, 0]).unwrap(), [4, 4]);
        assert_eq!(run(24, &[0, 2, 0]).unwrap(), [4, 2, 3]);
        assert_eq!(run(1, &[0, 0]).unwrap(), [1, 1]);
        assert_eq!(run(8, &[2, 4]).unwrap(), [2, 4]);
        assert_eq!(run(10, &[3, 0]).unwrap_err().class(), ErrorClass::Arg);
        assert_eq!(run(8, &[2, 2]).unwrap_err().class(), ErrorClass::Arg);
        assert_eq!(run(8, &[-1, 0]).unwrap_err().class(), ErrorClass::Dims);
    }

    #[test]
    fn grid_numbering_is_row_major_and_wraps_only_periodic_dimensions() {
        let g = Grid::new(&[2, 3], &[false, true], 6).unwrap();
        assert_eq!(g.coords_of(4), [1, 1]);
        assert_eq!(g.rank_of(&[1, 1]).unwrap(), 4);
        assert_eq!(g.rank_of(&[1, -1]).unwrap(), 5);
        assert_eq!(g.rank_of(&[2, 0]).unwrap_err().class(), ErrorClass::Arg);
        assert_eq!(g.rank_of(&[0]).unwrap_err().class(), ErrorClass::Dims);
        assert_eq!(g.step(&[0, 0], 0, -1), None);
        assert_eq!(g.step(&[0, 0], 0, 1), Some(3));
        assert_eq!(g.step(&[0, 0], 1, -1), Some(2));
        assert_eq!(
            Grid::new(&[2, 4], &[false, false], 7).unwrap_err().class(),
            ErrorClass::Arg
        );
        assert_eq!(
            Grid::new(&[2, 0], &[false, false], 7).unwrap_err().class(),
            ErrorClass::Dims
        );
        assert_eq!(
            Grid::new(&[2], &[false, false], 7).unwrap_err().class(),
            ErrorClass::Arg
        );
        // No dimensions: one cell.
        assert_eq!(Grid::new(&[], &[], 3).unwrap().cells(), 1);
    }

    #[test]
    fn placement_keeps_sites_in_slabs_across_the_longest_dimension() {
        // 2 x 4 grid, two sites of four: the identity puts a site in each row (4 edges
        // between sites); slabs across the longest dimension put one in each half (2).
        let g = Grid::new(&[2, 4], &[false, false], 8).unwrap();
        let places: Vec<(usize, usize)> = (0..8).map(|m| (m / 4, m / 4)).collect();
        let identity: Vec<usize> = (0..8).collect();
        assert_eq!(g.cut(&identity, &places).0, 4);
        let p = g.place(&places);
        assert_eq!(g.cut(&p, &places).0, 2);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, identity, "a permutation of the members");
        // One machine: nothing to gain, the identity stays.
        assert_eq!(g.place(&[(0, 0); 8]), identity);
        // Members out of site order (a split with keys): brought together.
        let mixed: Vec<(usize, usize)> = (0..8).map(|m| (m % 2, m % 2)).collect();
        let p = g.place(&mixed);
        assert_eq!(g.cut(&p, &mixed).0, 2);
    }
}
