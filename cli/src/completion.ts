/**
 * Shell completion scripts (`svc completion bash|zsh|fish`), generated from the
 * same command declarations that drive parsing and help, so a new command or
 * flag completes without anyone touching this file. Like `gh completion` and
 * `fly completion`, the script is printed and the user's shell loads it:
 *
 *   bash  echo 'eval "$(svc completion bash)"' >> ~/.bashrc
 *   zsh   svc completion zsh > "${fpath[1]}/_svc"   (or eval it after compinit)
 *   fish  svc completion fish > ~/.config/fish/completions/svc.fish
 *
 * Words completed: the nouns, a noun's verbs, a command's flags, the shells of
 * `svc completion`, the commands of `svc help`; file names for the flags that
 * take a path, and wherever nothing else applies.
 */
import type { Command, FlagInfo, Group } from "./command.js";

/** The completion model: each top-level word with its verbs, or its own flags. */
type CompletionEntry = { name: string; summary: string; verbs?: readonly Command[]; flags?: readonly FlagInfo[]; words?: readonly string[] };

export const SHELLS = ["bash", "zsh", "fish"] as const;
export type Shell = (typeof SHELLS)[number];

/** Flags whose value is a path: completed with file names. */
const PATH_FLAGS = new Set(["source", "dir", "file", "output"]);

/** The model of `entries` (groups and commands) plus the words `help` and `completion` take. */
function completionModel(entries: readonly (Group | Command)[]): CompletionEntry[] {
  return entries.map((entry) => {
    if ("commands" in entry) return { name: entry.name, summary: entry.summary, verbs: entry.commands };
    if (entry.name === "help") return { name: entry.name, summary: entry.summary, words: entries.map((e) => e.name).filter((n) => n !== "help") };
    if (entry.name === "completion") return { name: entry.name, summary: entry.summary, words: SHELLS };
    return { name: entry.name, summary: entry.summary, flags: entry.flags };
  });
}

const longFlags = (flags: readonly FlagInfo[]) => flags.flatMap((f) => [`--${f.name}`, ...(f.short ? [`-${f.short}`] : [])]);
const valueFlags = (flags: readonly FlagInfo[]) =>
  flags.filter((f) => f.takesValue).flatMap((f) => [`--${f.name}`, ...(f.short ? [`-${f.short}`] : [])]);

function bash(model: readonly CompletionEntry[]): string {
  const cases = model.map((entry) => {
    if (entry.verbs) {
      const verbCases = entry.verbs
        .map((v) => `        ${v.name}) words="${longFlags(v.flags).join(" ")}"; valued="${valueFlags(v.flags).join(" ")}" ;;`)
        .join("\n");
      return `    ${entry.name})
      if [[ -z $verb ]]; then words="${entry.verbs.map((v) => v.name).join(" ")}"; else
      case $verb in
${verbCases}
      esac
      fi ;;`;
    }
    if (entry.words) return `    ${entry.name}) [[ -z $verb ]] && words="${entry.words.join(" ")}" ;;`;
    const flags = entry.flags ?? [];
    return `    ${entry.name}) words="${longFlags(flags).join(" ")}"; valued="${valueFlags(flags).join(" ")}" ;;`;
  });
  return `# svc completion for bash. Load it from ~/.bashrc:  eval "$(svc completion bash)"
_svc() {
  local cur=\${COMP_WORDS[COMP_CWORD]} prev=\${COMP_WORDS[COMP_CWORD-1]}
  local noun="" verb="" words="" valued="" i
  for ((i = 1; i < COMP_CWORD; i++)); do
    [[ \${COMP_WORDS[i]} == -* ]] && continue
    if [[ -z $noun ]]; then noun=\${COMP_WORDS[i]}; elif [[ -z $verb ]]; then verb=\${COMP_WORDS[i]}; fi
  done
  if [[ -z $noun ]]; then
    words="${model.map((e) => e.name).join(" ")}"
  else
    case $noun in
${cases.join("\n")}
    esac
  fi
  # A flag that takes a value: complete file names (bash's default), not more flags.
  if [[ -n $prev && " $valued " == *" $prev "* ]]; then COMPREPLY=(); return; fi
  if [[ $cur != -* ]]; then words=$(printf '%s\\n' $words | grep -v -- '^-'); fi
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _svc svc
`;
}

/** A description inside single quotes, with what zsh's _arguments and _describe treat specially escaped. */
function zshText(text: string): string {
  return text.replace(/'/g, "'\\''").replace(/\[/g, "(").replace(/\]/g, ")").replace(/:/g, "\\:");
}

function zshArguments(flags: readonly FlagInfo[]): string {
  const specs = flags.map((f) => {
    const value = f.takesValue ? `:${f.name}:${PATH_FLAGS.has(f.name) ? "_files" : " "}` : "";
    const description = `[${zshText(f.description)}]`;
    return f.short ? `'(-${f.short} --${f.name})'{-${f.short},--${f.name}}'${description}${value}'` : `'--${f.name}${description}${value}'`;
  });
  return `_arguments -s ${specs.join(" ")} '*: :_files'`;
}

function zsh(model: readonly CompletionEntry[]): string {
  const described = (name: string, items: readonly { name: string; summary: string }[]) =>
    `local -a ${name}=(${items.map((i) => `'${zshText(i.name)}:${zshText(i.summary)}'`).join(" ")})`;
  const cases = model.map((entry) => {
    if (entry.verbs) {
      const verbCases = entry.verbs.map((v) => `        ${v.name}) ${zshArguments(v.flags)} ;;`).join("\n");
      return `    ${entry.name})
      if (( CURRENT == 3 )); then
        ${described("verbs", entry.verbs)}
        _describe -t commands 'svc ${entry.name} command' verbs
        return
      fi
      shift 2 words; (( CURRENT -= 2 ))
      case $verb in
${verbCases}
      esac ;;`;
    }
    if (entry.words) return `    ${entry.name}) (( CURRENT == 3 )) && compadd -- ${entry.words.join(" ")} ;;`;
    return `    ${entry.name}) shift words; (( CURRENT -= 1 )); ${zshArguments(entry.flags ?? [])} ;;`;
  });
  return `#compdef svc
# svc completion for zsh. Save it as _svc in a folder of $fpath (svc completion zsh > "\${fpath[1]}/_svc"),
# or load it after compinit:  eval "$(svc completion zsh)"
_svc() {
  local noun=\${words[2]} verb=\${words[3]}
  if (( CURRENT == 2 )); then
    ${described("nouns", model)}
    _describe -t commands 'svc command' nouns
    return
  fi
  case $noun in
${cases.join("\n")}
  esac
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then _svc "$@"; else compdef _svc svc; fi
`;
}

/** A single-quoted fish string. */
const fishText = (text: string) => `'${text.replace(/\\/g, "\\\\").replace(/'/g, "\\'")}'`;

function fishFlags(condition: string, flags: readonly FlagInfo[]): string[] {
  return flags.map((f) => {
    const short = f.short ? ` -s ${f.short}` : "";
    const value = f.takesValue ? (PATH_FLAGS.has(f.name) ? " -r -F" : " -r") : "";
    return `complete -c svc -n ${fishText(condition)}${short} -l ${f.name}${value} -d ${fishText(f.description)}`;
  });
}

function fish(model: readonly CompletionEntry[]): string {
  const lines = ["# svc completion for fish:  svc completion fish > ~/.config/fish/completions/svc.fish", "complete -c svc -f"];
  for (const entry of model) {
    lines.push(`complete -c svc -n '__fish_use_subcommand' -a ${entry.name} -d ${fishText(entry.summary)}`);
  }
  for (const entry of model) {
    const inNoun = `__fish_seen_subcommand_from ${entry.name}`;
    if (entry.verbs) {
      const verbs = entry.verbs.map((v) => v.name).join(" ");
      for (const verb of entry.verbs) {
        lines.push(`complete -c svc -n ${fishText(`${inNoun}; and not __fish_seen_subcommand_from ${verbs}`)} -a ${verb.name} -d ${fishText(verb.summary)}`);
        lines.push(...fishFlags(`${inNoun}; and __fish_seen_subcommand_from ${verb.name}`, verb.flags));
      }
    } else if (entry.words) {
      lines.push(`complete -c svc -n ${fishText(`${inNoun}; and not __fish_seen_subcommand_from ${entry.words.join(" ")}`)} -a ${fishText(entry.words.join(" "))}`);
    } else {
      lines.push(...fishFlags(inNoun, entry.flags ?? []));
    }
  }
  return `${lines.join("\n")}\n`;
}

/** The completion script of `shell` for `entries`. */
export function completionScript(shell: Shell, entries: readonly (Group | Command)[]): string {
  const model = completionModel(entries);
  return shell === "bash" ? bash(model) : shell === "zsh" ? zsh(model) : fish(model);
}
