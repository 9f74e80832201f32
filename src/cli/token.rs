//! `drover token ...`: signing keys, signed JWTs, and secrets for the tokens file.

use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;

#[derive(Subcommand)]
pub(crate) enum TokenCommand {
    /// Write a new ES256 signing key (`signing-key.pem`, owner-only) and the
    /// JWK set that verifies its tokens (`jwks.json`, for --jwks-file).
    Keygen {
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Print a JWT signed with a key from `drover token keygen`.
    Create {
        /// The signing key (PEM).
        #[arg(long, env = "DROVER_SIGNING_KEY")]
        key: std::path::PathBuf,
        /// The issuer (`iss`); a node accepts it when listed in --jwt-issuer.
        #[arg(long, default_value = "drover")]
        issuer: String,
        /// Who the token is for (`sub`).
        #[arg(long)]
        subject: String,
        /// Scopes, comma separated (jobs:work:orders-*,cluster:read).
        #[arg(long, value_delimiter = ',')]
        scopes: Vec<String>,
        /// Tenants, comma separated (`*`: every tenant; `<default>`: the default tenant).
        #[arg(long, value_delimiter = ',', default_value = "<default>")]
        tenants: Vec<String>,
        /// How long it is valid: 90s, 30m, 12h, 7d.
        #[arg(long, default_value = "1h")]
        ttl: String,
    },
    /// Print a new random secret and the tokens-file entry (its hash) to add.
    Secret {
        /// The token's name, as audit lines and errors show it.
        #[arg(long)]
        name: String,
        #[arg(long, value_delimiter = ',')]
        scopes: Vec<String>,
        #[arg(long, value_delimiter = ',', default_value = "<default>")]
        tenants: Vec<String>,
    },
}

/// `90s`, `30m`, `12h`, `7d`.
pub(crate) fn parse_ttl(text: &str) -> anyhow::Result<Duration> {
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    let amount: u64 = digits.parse().map_err(|_| anyhow::anyhow!("ttl {text:?} is not like 90s, 30m, 12h or 7d"))?;
    let secs = match unit {
        "s" => amount,
        "m" => amount * 60,
        "h" => amount * 3600,
        "d" => amount * 86_400,
        _ => anyhow::bail!("ttl {text:?} is not like 90s, 30m, 12h or 7d"),
    };
    anyhow::ensure!(secs > 0, "ttl must be more than zero");
    Ok(Duration::from_secs(secs))
}

pub(crate) fn token(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Keygen { out } => {
            let key = drover::auth::keys::write_signing_key(&out)?;
            println!(
                "signing key {} (key id {})\nJWK set {}",
                out.join("signing-key.pem").display(),
                key.key_id,
                out.join("jwks.json").display()
            );
        }
        TokenCommand::Create { key, issuer, subject, scopes, tenants, ttl } => {
            let pem = std::fs::read_to_string(&key).with_context(|| format!("reading {}", key.display()))?;
            let ttl = parse_ttl(&ttl)?;
            println!("{}", drover::auth::keys::create_token(&pem, &issuer, &subject, &scopes, &tenants, ttl)?);
        }
        TokenCommand::Secret { name, scopes, tenants } => {
            let secret = drover::auth::keys::generate_secret();
            eprintln!("# the secret (give it to the client; it is not stored anywhere):");
            println!("{secret}");
            eprintln!("# add to the tokens file:");
            eprint!("{}", drover::auth::keys::token_entry(&name, &secret, &scopes, &tenants));
        }
    }
    Ok(())
}
