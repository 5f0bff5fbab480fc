//! Parser for `nvidia-smi topo -m` text (reference §4.1).
//!
//! Accepted: tab-separated dumps as the tool prints them, and space-expanded copies (tabs turned into
//! spaces, as in pasted issues); NIC columns as `NICn` with a `NIC Legend:` block or as device names
//! (`mlx5_0`); `CPU Affinity`, `NUMA Affinity` and `GPU NUMA ID` columns in any subset; the extra empty
//! cell newer drivers put before `GPU NUMA ID`; NIC rows with, without or with fewer trailing cells;
//! legacy `SOC` for `SYS`; `NV1`..`NV18`.
//!
//! Rejected, with line, column and token: unknown tokens (including copies with lost tabs such as
//! `PXBNODE`), ragged rows, missing or out-of-order rows, a self cell that is not `X`, NVLinks to a NIC,
//! and asymmetric matrices.

use std::collections::HashMap;

use crate::cpuset::CpuSet;
use crate::error::TopologyError;
use crate::model::{CpuTopology, Gpu, MAX_NUMA_NODE, MAX_NVLINKS, Nic, NodeTopology, NumaNode, PairLink, PcieRelation};

/// One parsed matrix cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    Diagonal,
    Nvlink(u8),
    Pcie(PcieRelation),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Affinity {
    Cpu,
    Numa,
    GpuNumaId,
}

/// A line split into cells, each with its 1-based character column.
struct Cells<'a> {
    cells: Vec<(usize, &'a str)>,
}

fn split_cells(line: &str, tabbed: bool) -> Cells<'_> {
    let mut cells = Vec::new();
    if tabbed {
        let mut start = 0;
        for part in line.split('\t') {
            let lead = part.len() - part.trim_start().len();
            cells.push((line[..start + lead].chars().count() + 1, part.trim()));
            start += part.len() + 1;
        }
    } else {
        let mut rest = line;
        let mut offset = 0;
        while let Some(pos) = rest.find(|c: char| !c.is_whitespace()) {
            let tail = &rest[pos..];
            let len = tail.find(char::is_whitespace).unwrap_or(tail.len());
            cells.push((line[..offset + pos].chars().count() + 1, &tail[..len]));
            offset += pos + len;
            rest = &rest[pos + len..];
        }
    }
    Cells { cells }
}

/// Parse a `nvidia-smi topo -m` dump. `source_name` is used in error messages (a file name or
/// `<input>`).
pub fn parse_topo_matrix(text: &str, source_name: &str) -> Result<NodeTopology, TopologyError> {
    let err = |line: usize, column: usize, message: String| TopologyError::Parse {
        source_name: source_name.to_string(),
        line,
        column,
        message,
    };
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
    let header_idx = lines
        .iter()
        .position(|l| !l.trim().is_empty())
        .ok_or_else(|| err(1, 1, "empty input: expected the header line of `nvidia-smi topo -m`".into()))?;
    let header_line = lines[header_idx];
    let tabbed = header_line.contains('\t');

    // Header: device columns, then affinity columns.
    let raw = split_cells(header_line, tabbed).cells;
    let mut header: Vec<(usize, String)> = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        let (col, tok) = raw[i];
        if tok.is_empty() {
            i += 1;
            continue;
        }
        // Space-expanded headers split the multi-word names; join them back.
        let joined = if !tabbed && tok == "CPU" && raw.get(i + 1).map(|c| c.1) == Some("Affinity") {
            i += 1;
            "CPU Affinity".to_string()
        } else if !tabbed && tok == "NUMA" && raw.get(i + 1).map(|c| c.1) == Some("Affinity") {
            i += 1;
            "NUMA Affinity".to_string()
        } else if !tabbed
            && tok == "GPU"
            && raw.get(i + 1).map(|c| c.1) == Some("NUMA")
            && raw.get(i + 2).map(|c| c.1) == Some("ID")
        {
            i += 2;
            "GPU NUMA ID".to_string()
        } else {
            tok.to_string()
        };
        header.push((col, joined));
        i += 1;
    }
    let header_line_no = header_idx + 1;
    let mut device_cols: Vec<(usize, String)> = Vec::new();
    let mut affinity_cols: Vec<Affinity> = Vec::new();
    for (col, name) in &header {
        let aff = match name.as_str() {
            "CPU Affinity" => Some(Affinity::Cpu),
            "NUMA Affinity" => Some(Affinity::Numa),
            "GPU NUMA ID" => Some(Affinity::GpuNumaId),
            _ => None,
        };
        match aff {
            Some(a) => affinity_cols.push(a),
            None if !affinity_cols.is_empty() => {
                return Err(err(
                    header_line_no,
                    *col,
                    format!("device column '{name}' after the affinity columns; header is out of order"),
                ));
            }
            None => device_cols.push((*col, name.clone())),
        }
    }
    let gpu_cols: Vec<&(usize, String)> = device_cols.iter().take_while(|(_, n)| gpu_number(n).is_some()).collect();
    let n_gpu = gpu_cols.len();
    if n_gpu == 0 {
        return Err(err(
            header_line_no,
            1,
            format!("header has no GPU columns; expected 'GPU0 GPU1 …', found '{}'", header_line.trim()),
        ));
    }
    for (pos, (col, name)) in gpu_cols.iter().enumerate() {
        if gpu_number(name) != Some(pos as u32) {
            return Err(err(header_line_no, *col, format!("column '{name}' out of order; expected 'GPU{pos}'")));
        }
    }
    let nic_names: Vec<String> = device_cols[n_gpu..].iter().map(|(_, n)| n.clone()).collect();
    for (col, name) in &device_cols[n_gpu..] {
        if gpu_number(name).is_some() {
            return Err(err(header_line_no, *col, format!("GPU column '{name}' after NIC columns")));
        }
    }
    let n_dev = device_cols.len();
    let n_nic = n_dev - n_gpu;

    // Rows.
    let mut gpu_rows: Vec<Vec<Cell>> = Vec::with_capacity(n_gpu);
    let mut gpu_row_lines: Vec<usize> = Vec::with_capacity(n_gpu);
    let mut nic_rows: Vec<Option<(usize, Vec<Cell>)>> = vec![None; n_nic];
    let mut gpus: Vec<Gpu> = Vec::with_capacity(n_gpu);
    let mut row_no = header_idx + 1;
    while row_no < lines.len() {
        let line = lines[row_no];
        let line_no = row_no + 1;
        row_no += 1;
        if line.trim().is_empty() || line.trim_start().starts_with("Legend:") {
            break;
        }
        let cells = split_cells(line, tabbed).cells;
        let (label_col, label) = cells[0];
        let label = if label.is_empty() {
            return Err(err(line_no, label_col, "row has no label; expected 'GPUn' or a NIC name".into()));
        } else {
            label
        };
        let row_kind = if let Some(g) = gpu_number(label) {
            if g as usize != gpu_rows.len() || gpu_rows.len() >= n_gpu {
                return Err(err(
                    line_no,
                    label_col,
                    format!("row '{label}' out of order; expected 'GPU{}'", gpu_rows.len()),
                ));
            }
            None
        } else if let Some(k) = nic_names.iter().position(|n| n == label) {
            if gpu_rows.len() != n_gpu {
                return Err(err(line_no, label_col, format!("NIC row '{label}' before all {n_gpu} GPU rows")));
            }
            if nic_rows[k].is_some() {
                return Err(err(line_no, label_col, format!("NIC row '{label}' appears twice")));
            }
            Some(k)
        } else {
            return Err(err(
                line_no,
                label_col,
                format!("unknown row label '{label}'; expected 'GPU{}' or one of the NIC columns", gpu_rows.len()),
            ));
        };
        let body = &cells[1..];
        if body.len() < n_dev {
            let (col, _) = body.last().copied().unwrap_or((label_col, ""));
            return Err(err(
                line_no,
                col,
                format!("ragged row '{label}': {} device cells, the header has {n_dev}", body.len()),
            ));
        }
        let row_index = row_kind.map_or(gpu_rows.len(), |k| n_gpu + k);
        let mut parsed = Vec::with_capacity(n_dev);
        for (c, &(col, tok)) in body[..n_dev].iter().enumerate() {
            let col_name = &device_cols[c].1;
            let cell = parse_cell(tok).ok_or_else(|| {
                err(
                    line_no,
                    col,
                    format!(
                        "unknown token '{tok}' in row '{label}', column '{col_name}' \
                         (expected X, NV1..NV{MAX_NVLINKS}, PIX, PXB, PHB, NODE, SYS or SOC)"
                    ),
                )
            })?;
            let is_self = c == row_index;
            match cell {
                Cell::Diagonal if !is_self => {
                    return Err(err(
                        line_no,
                        col,
                        format!("'X' off the diagonal in row '{label}', column '{col_name}'"),
                    ));
                }
                Cell::Nvlink(_) | Cell::Pcie(_) if is_self => {
                    return Err(err(line_no, col, format!("self cell of '{label}' is '{tok}', expected 'X'")));
                }
                Cell::Nvlink(_) if c >= n_gpu || row_kind.is_some() => {
                    return Err(err(
                        line_no,
                        col,
                        format!("'{tok}' between '{label}' and '{col_name}': NVLink joins GPUs only"),
                    ));
                }
                _ => {}
            }
            parsed.push(cell);
        }
        let trailing: Vec<(usize, &str)> = body[n_dev..].to_vec();
        match row_kind {
            None => {
                let gpu = parse_gpu_affinity(gpu_rows.len() as u32, &trailing, &affinity_cols, tabbed)
                    .map_err(|(col, m)| err(line_no, col, m))?;
                gpus.push(gpu);
                gpu_rows.push(parsed);
                gpu_row_lines.push(line_no);
            }
            Some(k) => {
                if let Some(&(col, tok)) = trailing.iter().find(|(_, t)| !t.is_empty())
                    && (tabbed || trailing.len() > affinity_cols.len())
                {
                    // NIC rows carry no affinity values; anything here is a ragged row.
                    return Err(err(
                        line_no,
                        col,
                        format!("unexpected cell '{tok}' after the device columns of NIC row '{label}'"),
                    ));
                }
                nic_rows[k] = Some((line_no, parsed));
            }
        }
    }
    if gpu_rows.len() != n_gpu {
        return Err(err(row_no, 1, format!("found {} GPU rows, the header has {n_gpu} GPU columns", gpu_rows.len())));
    }

    // NIC legend: `NICn: mlx5_0`.
    let mut legend: HashMap<String, String> = HashMap::new();
    let mut legend_lines: HashMap<String, usize> = HashMap::new();
    let mut in_nic_legend = false;
    for (i, line) in lines.iter().enumerate().skip(row_no) {
        let t = line.trim();
        if t == "NIC Legend:" {
            in_nic_legend = true;
        } else if in_nic_legend && let Some((k, v)) = t.split_once(':') {
            legend.insert(k.trim().to_string(), v.trim().to_string());
            legend_lines.insert(k.trim().to_string(), i + 1);
        }
    }

    // GPU pair matrix, checked for symmetry.
    let mut links = vec![PairLink::default(); n_gpu * n_gpu];
    for a in 0..n_gpu {
        for b in 0..n_gpu {
            if a == b {
                continue;
            }
            let (ab, ba) = (gpu_rows[a][b], gpu_rows[b][a]);
            if ab != ba {
                let col = split_cells(lines[gpu_row_lines[a] - 1], tabbed).cells[1 + b].0;
                return Err(err(
                    gpu_row_lines[a],
                    col,
                    format!(
                        "asymmetric matrix: GPU{a}->GPU{b} is {} but GPU{b}->GPU{a} (line {}) is {}",
                        cell_token(ab),
                        gpu_row_lines[b],
                        cell_token(ba)
                    ),
                ));
            }
            links[a * n_gpu + b] = match ab {
                Cell::Nvlink(n) => PairLink { pcie: None, nvlinks: n },
                Cell::Pcie(r) => PairLink { pcie: Some(r), nvlinks: 0 },
                Cell::Diagonal => PairLink::default(),
            };
        }
    }

    // GPU-NIC relations: from the GPU rows, checked against NIC rows where present.
    let mut nic_links = vec![None; n_gpu * n_nic];
    for g in 0..n_gpu {
        for k in 0..n_nic {
            let from_gpu = gpu_rows[g][n_gpu + k];
            if let Some((nic_line, row)) = &nic_rows[k]
                && row[g] != from_gpu
            {
                return Err(err(
                    *nic_line,
                    1,
                    format!(
                        "asymmetric matrix: GPU{g}->{} is {} but {}->GPU{g} is {}",
                        nic_names[k],
                        cell_token(from_gpu),
                        nic_names[k],
                        cell_token(row[g])
                    ),
                ));
            }
            if let Cell::Pcie(r) = from_gpu {
                nic_links[g * n_nic + k] = Some(r);
            }
        }
    }
    let nics: Vec<Nic> = nic_names
        .iter()
        .map(|name| {
            let rdma = legend.get(name).cloned().or_else(|| (!name.starts_with("NIC")).then(|| name.clone()));
            Nic {
                name: rdma.clone().unwrap_or_else(|| name.clone()),
                rdma_device: rdma,
                netdev: None,
                pci_bus_id: None,
                numa_node: None,
            }
        })
        .collect();
    // NICs are identified by name (the inventory's `nicLinks`): two columns naming one NIC are an error.
    for (k, nic) in nics.iter().enumerate() {
        if let Some(first) = nics[..k].iter().position(|x| x.name == nic.name) {
            let (line, column) = match legend_lines.get(&nic_names[k]) {
                Some(&l) => (l, 1),
                None => (header_line_no, device_cols[n_gpu + k].0),
            };
            return Err(err(
                line,
                column,
                format!(
                    "NIC columns '{}' and '{}' both name '{}'; NIC names must be unique",
                    nic_names[first], nic_names[k], nic.name
                ),
            ));
        }
    }

    let cpus = cpu_topology_from_gpus(&gpus);
    let mut node = NodeTopology::new(None, gpus, nics, links, nic_links)?;
    node.cpus = cpus;
    Ok(node)
}

fn gpu_number(name: &str) -> Option<u32> {
    name.strip_prefix("GPU").and_then(|n| if n.chars().all(|c| c.is_ascii_digit()) { n.parse().ok() } else { None })
}

fn parse_cell(tok: &str) -> Option<Cell> {
    if tok == "X" {
        return Some(Cell::Diagonal);
    }
    if let Some(n) = tok.strip_prefix("NV") {
        if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) {
            let n: u8 = n.parse().ok()?;
            return (1..=MAX_NVLINKS).contains(&n).then_some(Cell::Nvlink(n));
        }
        return None;
    }
    tok.parse::<PcieRelation>().ok().filter(|r| *r != PcieRelation::SameBoard).map(Cell::Pcie)
}

fn cell_token(c: Cell) -> String {
    match c {
        Cell::Diagonal => "X".into(),
        Cell::Nvlink(n) => format!("NV{n}"),
        Cell::Pcie(r) => r.token().into(),
    }
}

fn parse_gpu_affinity(
    index: u32,
    trailing: &[(usize, &str)],
    cols: &[Affinity],
    tabbed: bool,
) -> Result<Gpu, (usize, String)> {
    // Tab mode is positional except for the extra empty cell newer drivers insert before GPU NUMA ID;
    // drop empty cells while there are more cells than columns. Space mode has no empty cells.
    let mut cells: Vec<(usize, &str)> = trailing.to_vec();
    if tabbed {
        while cells.len() > cols.len() {
            match cells.iter().rposition(|(_, t)| t.is_empty()) {
                Some(p) => {
                    cells.remove(p);
                }
                None => break,
            }
        }
    }
    if cells.len() > cols.len() {
        let (col, tok) = cells[cols.len()];
        return Err((col, format!("unexpected cell '{tok}' after the affinity columns of row 'GPU{index}'")));
    }
    let mut gpu = Gpu::with_index(index);
    for (&(col, tok), kind) in cells.iter().zip(cols) {
        if tok.is_empty() || tok.eq_ignore_ascii_case("N/A") {
            continue;
        }
        match kind {
            Affinity::Cpu => {
                gpu.cpu_affinity =
                    Some(tok.parse::<CpuSet>().map_err(|e| (col, format!("CPU Affinity of GPU{index}: {e}")))?);
            }
            Affinity::Numa => {
                // A single node; ranges (`0-1`) mean the GPU has no single local node.
                if tok.chars().all(|c| c.is_ascii_digit()) {
                    let node = tok.parse::<u32>().ok().filter(|&n| n <= MAX_NUMA_NODE).ok_or_else(|| {
                        (
                            col,
                            format!(
                                "NUMA Affinity of GPU{index} is {tok}, above the highest NUMA node Linux supports \
                                 ({MAX_NUMA_NODE})"
                            ),
                        )
                    })?;
                    gpu.numa_node = Some(node);
                } else if tok.parse::<CpuSet>().is_err() {
                    return Err((
                        col,
                        format!("NUMA Affinity of GPU{index} is '{tok}', expected a node number, a range or N/A"),
                    ));
                }
            }
            Affinity::GpuNumaId => {
                if !tok.chars().all(|c| c.is_ascii_digit()) {
                    return Err((col, format!("GPU NUMA ID of GPU{index} is '{tok}', expected a number or N/A")));
                }
            }
        }
    }
    Ok(gpu)
}

/// NUMA nodes as far as the GPU rows tell them: each GPU's NUMA node with its affinity CPUs.
fn cpu_topology_from_gpus(gpus: &[Gpu]) -> CpuTopology {
    let mut nodes: Vec<NumaNode> = Vec::new();
    for g in gpus {
        if let (Some(id), Some(cpus)) = (g.numa_node, &g.cpu_affinity) {
            match nodes.iter_mut().find(|n| n.id == id) {
                Some(n) => {
                    for c in cpus.iter() {
                        n.cpus.insert(c);
                    }
                }
                None => nodes.push(NumaNode { id, cpus: cpus.clone() }),
            }
        }
    }
    nodes.sort_by_key(|n| n.id);
    CpuTopology { numa_nodes: nodes, sockets: None, online: None }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    const SMALL: &str = "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\n\
GPU0\t X \tNV2\tSYS\tPIX\t0-3\t0\n\
GPU1\tNV2\t X \tSOC\tPHB\t0-3\t0\n\
GPU2\tSYS\tSYS\t X \tSYS\t4-7\t1\n\
NIC0\tPIX\tPHB\tSYS\t X \n\
\n\
Legend:\n\
\n\
NIC Legend:\n\
\n\
  NIC0: mlx5_4\n";

    #[test]
    fn parses_relations_nics_and_affinity() {
        let node = parse_topo_matrix(SMALL, "small").unwrap();
        assert_eq!(node.gpu_count(), 3);
        assert_eq!(node.link(0, 1), PairLink { pcie: None, nvlinks: 2 });
        assert_eq!(node.link(1, 2).pcie, Some(PcieRelation::Sys), "SOC reads as SYS");
        assert_eq!(node.nics[0].name, "mlx5_4");
        assert_eq!(node.nic_link(1, 0), Some(PcieRelation::Phb));
        assert_eq!(node.gpus[2].numa_node, Some(1));
        assert_eq!(node.gpus[2].cpu_affinity.as_ref().map(ToString::to_string).as_deref(), Some("4-7"));
        assert_eq!(node.cpus.numa_nodes.len(), 2);
    }

    #[test]
    fn space_expanded_copy_parses_to_the_same_model() {
        let spaced: String = SMALL.replace('\t', "    ");
        let a = parse_topo_matrix(SMALL, "tabs").unwrap();
        let b = parse_topo_matrix(&spaced, "spaces").unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn unknown_token_names_line_column_and_token() {
        let bad = SMALL.replace("GPU2\tSYS\tSYS", "GPU2\tSYS\tPXBNODE");
        let e = parse_topo_matrix(&bad, "f.txt").unwrap_err().to_string();
        assert!(e.starts_with("f.txt:4:"), "{e}");
        assert!(e.contains("'PXBNODE'") && e.contains("column 'GPU1'"), "{e}");
    }

    #[test]
    fn asymmetric_gpu_cells_are_rejected() {
        let bad = SMALL.replace("GPU1\tNV2", "GPU1\tNV1");
        let e = parse_topo_matrix(&bad, "f").unwrap_err().to_string();
        assert!(e.contains("asymmetric") && e.contains("NV2") && e.contains("NV1"), "{e}");
    }

    #[test]
    fn ragged_row_is_rejected() {
        let bad = SMALL.replace("GPU2\tSYS\tSYS\t X \tSYS\t4-7\t1", "GPU2\tSYS\tSYS");
        let e = parse_topo_matrix(&bad, "f").unwrap_err().to_string();
        assert!(e.contains("f:4:") && e.contains("ragged"), "{e}");
    }

    #[test]
    fn nvlink_to_a_nic_and_nv19_are_rejected() {
        let bad = SMALL.replace("GPU0\t X \tNV2\tSYS\tPIX", "GPU0\t X \tNV2\tSYS\tNV1");
        assert!(parse_topo_matrix(&bad, "f").unwrap_err().to_string().contains("NVLink joins GPUs only"));
        let bad = SMALL.replace("NV2", "NV19");
        assert!(parse_topo_matrix(&bad, "f").unwrap_err().to_string().contains("'NV19'"));
    }

    #[test]
    fn empty_and_headerless_input_are_errors_not_panics() {
        assert!(parse_topo_matrix("", "f").is_err());
        assert!(parse_topo_matrix("\n\n", "f").is_err());
        assert!(parse_topo_matrix("hello world\n", "f").is_err());
        assert!(parse_topo_matrix("\tGPU0\nGPU0\n", "f").is_err());
    }
}
