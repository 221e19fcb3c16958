//! The `needs.X` and `env.X` a service's templates read, against what the site gives that
//! service: a name it does not give would only fail when the template is rendered for a host.

use super::error::SiteError;
use super::model::File;
use super::suggest;
use miette::{NamedSource, SourceSpan};
use std::sync::Arc;

/// Reports each `needs.X` that `service` does not need and each `env.X` it is not given, read
/// by one of its templates; whether none was found.
pub fn check(
    service: &str,
    files: &[File],
    needs: &[&str],
    env: &[&str],
    errors: &mut Vec<SiteError>,
) -> bool {
    let mut ok = true;
    for f in files {
        let Some(t) = &f.template else {
            continue;
        };
        let mut jinja = minijinja::Environment::new();
        jinja.set_keep_trailing_newline(true);
        let Ok(template) = jinja.template_from_str(&t.text) else {
            continue;
        };
        let mut read: Vec<String> = template.undeclared_variables(true).into_iter().collect();
        read.sort();
        for path in read {
            let Some((scope, name)) = path.split_once('.') else {
                continue;
            };
            let name = name.split('.').next().unwrap_or(name);
            let (known, what, given) = match scope {
                "needs" => (needs, "needs", format!("`{service}` needs")),
                "env" => (env, "env", format!("`{service}` is given")),
                _ => continue,
            };
            if known.contains(&name) {
                continue;
            }
            let list = if known.is_empty() {
                format!("{given} none")
            } else {
                format!("{given} {}", known.join(", "))
            };
            let help = match suggest::closest(name, known.iter().copied()) {
                Some(near) => format!("did you mean `{what}.{near}`? ({list})"),
                None if what == "needs" => format!(
                    "{list}: add `needs \"{name}\" addressable=\"all\"` to `{service}`, or read another"
                ),
                None => format!("{list}: add `env \"{name}\" \"…\"` to `{service}` or the site"),
            };
            let shown = f.source.display().to_string();
            let text = t.text.as_str();
            errors.push(SiteError::Template {
                path: shown.clone(),
                message: format!("`{what}.{name}` is not given to service `{service}`"),
                src: NamedSource::new(shown, Arc::new(t.text.clone())),
                span: name_span(text, what, name),
                label: if what == "needs" {
                    format!("`{service}` does not need `{name}`")
                } else {
                    format!("`{service}` is given no `{name}`")
                },
                help,
            });
            ok = false;
        }
    }
    ok
}

/// Where `scope.name` is first read in `text` (the name's part), else the start.
fn name_span(text: &str, scope: &str, name: &str) -> SourceSpan {
    let written = format!("{scope}.{name}");
    let ends_word = |i: usize| {
        text[i..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
    };
    text.match_indices(&written)
        .find(|(i, _)| {
            let before = text[..*i].chars().next_back();
            before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                && ends_word(i + written.len())
        })
        .map_or(SourceSpan::from(0..0), |(i, _)| {
            let start = i + scope.len() + 1;
            SourceSpan::from(start..start + name.len())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_span_is_the_name_read() {
        let text = "x {{ needs.apu }} {{ env.MODEE }}";
        let s = name_span(text, "needs", "apu");
        assert_eq!(&text[s.offset()..s.offset() + s.len()], "apu");
        let s = name_span(text, "env", "MODEE");
        assert_eq!(&text[s.offset()..s.offset() + s.len()], "MODEE");
    }
}
