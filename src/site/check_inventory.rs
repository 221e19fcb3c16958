//! The platform's `inventory` node → an [`InventorySpec`], with every problem reported.

use super::check::Checker;
use super::error::{SiteError, Src};
use super::ids::IdVec;
use super::model::*;
use super::raw_inventory::{self, RawHost, RawInventory};
use super::read::Reader;
use super::source::{beside, Referrer};
use super::suggest;
use miette::SourceSpan;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use super::check_service::Classes;

const BACKENDS: [&str; 3] = ["static", "ec2", "command"];
const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Checks the inventory node of the platform at `path` against the site's classes.
pub fn inventory(
    ck: &mut Checker,
    inv: RawInventory,
    src: &Src,
    path: &Path,
    classes: &Classes,
) -> Option<(InventorySpec, OnEmpty)> {
    let mut r = Reader {
        src,
        errors: &mut ck.errors,
    };
    let on_empty = match inv.on_empty.as_ref().map(|o| o.value.as_str()) {
        None | Some("error") => OnEmpty::Error,
        Some("warn") => OnEmpty::Warn,
        Some(other) => {
            let span = inv
                .on_empty
                .as_ref()
                .map(|o| o.span)
                .unwrap_or(inv.kind.span);
            r.bad(
                span,
                "`on-empty`".into(),
                format!("`{other}` is not a choice"),
                suggest::help(other, "choice", &["error", "warn"]),
            );
            return None;
        }
    };
    let misplaced: &[(&str, bool)] = match inv.kind.value.as_str() {
        "static" => &[
            ("region", inv.region.is_some()),
            ("endpoint", inv.endpoint.is_some()),
            ("profile", inv.profile.is_some()),
            ("address", inv.address.is_some()),
            ("timeout", inv.timeout.is_some()),
        ],
        "ec2" => &[
            ("file", inv.file.is_some()),
            ("timeout", inv.timeout.is_some()),
        ],
        "command" => &[
            ("file", inv.file.is_some()),
            ("region", inv.region.is_some()),
            ("endpoint", inv.endpoint.is_some()),
            ("profile", inv.profile.is_some()),
            ("address", inv.address.is_some()),
        ],
        other => {
            let help = suggest::help(other, "inventory backend", &BACKENDS);
            r.bad(
                inv.kind.span,
                "the inventory".into(),
                format!("`{other}` is not an inventory backend"),
                help,
            );
            return None;
        }
    };
    if let Some((key, _)) = misplaced.iter().find(|(_, set)| *set) {
        let kind = inv.kind.value.clone();
        r.bad(
            inv.kind.span,
            "the inventory".into(),
            format!("the {kind} backend takes no `{key}=`"),
            format!("remove `{key}=`"),
        );
        return None;
    }
    let spec = match inv.kind.value.as_str() {
        "ec2" => ec2(&mut r, &inv, classes),
        "command" => inv.run.as_ref().map(|run| {
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            InventorySpec::Command(CommandSpec {
                argv: run.value.clone(),
                dir,
                timeout: inv
                    .timeout
                    .as_ref()
                    .map_or(DEFAULT_COMMAND_TIMEOUT, |t| t.value),
            })
        }),
        _ => static_hosts(ck, inv, src, path, classes, on_empty),
    }?;
    Some((spec, on_empty))
}

fn ec2(r: &mut Reader<'_>, inv: &RawInventory, classes: &Classes) -> Option<InventorySpec> {
    let before = r.errors.len();
    let address = match inv.address.as_ref() {
        None => AddressField::PrivateIp,
        Some(a) => match AddressField::NAMES.iter().find(|(n, _)| *n == a.value) {
            Some((_, f)) => *f,
            None => {
                let names: Vec<&str> = AddressField::NAMES.iter().map(|(n, _)| *n).collect();
                r.bad(
                    a.span,
                    "`address`".into(),
                    format!("`{}` is not an address field", a.value),
                    suggest::help(&a.value, "address field", &names),
                );
                AddressField::PrivateIp
            }
        },
    };
    let class_names: Vec<&str> = classes.keys().map(String::as_str).collect();
    let mut mapped: Vec<(ClassId, Vec<(String, String)>)> = Vec::new();
    for c in &inv.classes {
        match classes.get(&c.name.value) {
            None => r.errors.push(SiteError::UnknownName {
                kind: "class".into(),
                name: c.name.value.clone(),
                src: r.src.clone(),
                span: c.name.span,
                help: suggest::help(&c.name.value, "class", &class_names),
            }),
            Some((cid, _, _)) if mapped.iter().any(|(m, _)| m == cid) => r.bad(
                c.name.span,
                "the ec2 inventory".into(),
                format!("class `{}` is mapped twice", c.name.value),
                "give each class one `class` node; several tags on it are ANDed".into(),
            ),
            Some((cid, _, _)) => mapped.push((*cid, c.tags.clone())),
        }
    }
    for (name, (cid, _, _)) in classes {
        if !mapped.iter().any(|(m, _)| m == cid) {
            r.missing(
                inv.kind.span,
                format!("the tags of class `{name}`"),
                format!("add `class \"{name}\" tag=\"role={name}\"` to the ec2 inventory"),
            );
        }
    }
    mapped.sort_by_key(|(c, _)| *c);
    (r.errors.len() == before).then(|| {
        InventorySpec::Ec2(Ec2Spec {
            region: inv.region.as_ref().map(|s| s.value.clone()),
            endpoint: inv.endpoint.as_ref().map(|s| s.value.clone()),
            profile: inv.profile.as_ref().map(|s| s.value.clone()),
            address,
            classes: mapped,
        })
    })
}

fn static_hosts(
    ck: &mut Checker,
    inv: RawInventory,
    src: &Src,
    path: &Path,
    classes: &Classes,
    on_empty: OnEmpty,
) -> Option<InventorySpec> {
    // Each host with the index of its file in `srcs` (not a copy of the file's name per host).
    let mut srcs: Vec<Src> = vec![src.clone()];
    let mut all: Vec<(RawHost, usize)> = inv.hosts.into_iter().map(|h| (h, 0)).collect();
    if let Some(file) = &inv.file {
        let hosts_path = beside(path, &file.value);
        let (fsrc, doc) = ck.sources.load(
            &hosts_path,
            Some(Referrer {
                src,
                span: file.span,
            }),
            &mut ck.errors,
        )?;
        let hosts = raw_inventory::hosts_file(
            &mut Reader {
                src: &fsrc,
                errors: &mut ck.errors,
            },
            &doc,
        );
        all.extend(hosts.into_iter().map(|h| (h, srcs.len())));
        srcs.push(fsrc);
    }
    let errors = &mut ck.errors;
    let class_names: Vec<&str> = classes.keys().map(String::as_str).collect();
    let mut seen: HashMap<&str, (SourceSpan, &Src)> = HashMap::with_capacity(all.len());
    let mut counts: IdVec<ClassId, usize> = vec![0usize; classes.len()].into();
    // Per host, its class when it is complete: the hosts are moved, not copied, afterwards.
    let mut valid: Vec<Option<ClassId>> = Vec::with_capacity(all.len());
    let before = errors.len();
    for (h, file) in &all {
        valid.push(None);
        let hsrc = &srcs[*file];
        if let Some((first, first_src)) = seen.insert(&h.name.value, (h.name.span, hsrc)) {
            let same_file = first_src.name() == hsrc.name();
            errors.push(SiteError::Duplicate {
                kind: "host".into(),
                name: h.name.value.clone(),
                src: hsrc.clone(),
                first: if same_file { first } else { h.name.span },
                second: h.name.span,
                help: if same_file {
                    "host names must be unique in an inventory".into()
                } else {
                    format!(
                        "host names must be unique in an inventory; it is also in {}",
                        first_src.name()
                    )
                },
            });
        }
        let (Some(_), Some(class)) = (&h.address, &h.class) else {
            continue;
        };
        let Some((cid, _, _)) = classes.get(&class.value) else {
            errors.push(SiteError::UnknownName {
                kind: "class".into(),
                name: class.value.clone(),
                src: hsrc.clone(),
                span: class.span,
                help: suggest::help(&class.value, "class", &class_names),
            });
            continue;
        };
        counts[*cid] += 1;
        if let Some(last) = valid.last_mut() {
            *last = Some(*cid);
        }
    }
    let hosts: Vec<HostSpec> = all
        .into_iter()
        .zip(valid)
        .filter_map(|((h, _), class)| {
            Some(HostSpec {
                class: class?,
                address: h.address?.value,
                name: h.name.value,
                tags: h.tags.into_iter().collect(),
            })
        })
        .collect();
    if on_empty == OnEmpty::Error {
        for (name, (cid, span, site)) in classes {
            if counts[*cid] == 0 {
                errors.push(SiteError::EmptyClass {
                    name: name.clone(),
                    src: site.clone(),
                    span: *span,
                    inventory: format!("the inventory of {}", src.name()),
                    help: format!("add a host with class=\"{name}\" to the inventory, remove the class, or set on-empty=\"warn\""),
                });
            }
        }
    }
    (errors.len() == before).then_some(InventorySpec::Static { hosts })
}
