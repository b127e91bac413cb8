import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import {
  absentOptionalNote,
  describeInstallFailure,
  findAbsentOptional,
  lockfileRefusal,
} from "../../builder/src/jobs/install-error.js";
import { NPM_INSTALL_KEEPING_LOCKFILE } from "../../builder/src/jobs/install.js";

/** npm's usage text after a refusal, as npm 11 prints it (abridged: it runs to ~80 lines). */
const USAGE = [
  "npm error",
  "npm error Clean install a project",
  "npm error",
  "npm error Usage:",
  "npm error npm ci",
  "npm error",
  "npm error Options:",
  "npm error [--install-strategy <hoisted|nested|shallow|linked>] [--legacy-bundling]",
  "npm error",
  "npm error aliases: clean-install, ic, install-clean, isntall-clean",
  "npm error",
  'npm error Run "npm help ci" for more info',
  "npm error A complete log of this run can be found in: /work/.npm/_logs/2026-01-01T00_00_00_000Z-debug-0.log",
];

/** What `npm ci` (npm 11.19) printed for a lockfile of the Vite react-ts scaffold with `missing` left out of it. */
function refused(...differences: string[]): string[] {
  return [
    "npm error code EUSAGE",
    "npm error",
    "npm error `npm ci` can only install packages when your package.json and package-lock.json or npm-shrinkwrap.json are in sync. Please update your lock file with `npm install` before continuing.",
    "npm error",
    ...differences.map((difference) => `npm error ${difference}`),
    ...USAGE,
  ];
}

describe("npm ci's refusal of a lockfile", () => {
  it("reads each difference npm ci lists, an empty version where the registry has no such package", () => {
    // Real: the react-ts scaffold's lockfile with react changed to 19.0.0 and two binding entries removed, through a mirror lacking one of them.
    const output = refused(
      "Invalid: lock file's react@19.0.0 does not satisfy react@19.3.1",
      "Missing: @oxlint/binding-android-arm-eabi@ from lock file",
      "Missing: @rolldown/binding-win32-x64-msvc@1.2.19 from lock file",
    );
    expect(lockfileRefusal(output)).toEqual({
      missing: [
        { name: "@oxlint/binding-android-arm-eabi", version: "" },
        { name: "@rolldown/binding-win32-x64-msvc", version: "1.2.19" },
      ],
      invalid: ["Invalid: lock file's react@19.0.0 does not satisfy react@19.3.1"],
      said: [
        "Invalid: lock file's react@19.0.0 does not satisfy react@19.3.1",
        "Missing: @oxlint/binding-android-arm-eabi@ from lock file",
        "Missing: @rolldown/binding-win32-x64-msvc@1.2.19 from lock file",
      ],
      omitted: 0,
    });
    expect(lockfileRefusal(["npm error code E404", "npm error 404 Not Found - GET http://registry/nope"])).toBeNull();
  });

  it("names the packages that differ and says to run npm install, never quoting the usage text", () => {
    const said = describeInstallFailure(refused("Missing: left-pad@1.3.0 from lock file"), "package-lock.json", "npm");
    expect(said).toBe(
      'npm ci found package-lock.json out of sync with package.json: "Missing: left-pad@1.3.0 from lock file"; run npm install and commit package-lock.json',
    );
    const many = describeInstallFailure(
      refused(...["a", "b", "c", "d", "e"].map((name) => `Missing: ${name}@1.0.0 from lock file`)),
      "package-lock.json",
      "npm",
    );
    expect(many).toBe(
      'npm ci found package-lock.json out of sync with package.json: "Missing: a@1.0.0 from lock file", "Missing: b@1.0.0 from lock file", "Missing: c@1.0.0 from lock file" and 2 more; run npm install and commit package-lock.json',
    );
    expect(many).not.toMatch(/Usage|Clean install/);
  });

  it("reads a bounded number of differences, and counts the rest", () => {
    const differences = Array.from({ length: 250 }, (_, n) => `Missing: @x/binding-${n}@ from lock file`);
    expect(describeInstallFailure(refused(...differences), "package-lock.json", "npm")).toMatch(/ and 247 more; run npm install and commit package-lock\.json$/);
    const lock = JSON.stringify({ packages: { "node_modules/x": { version: "1.0.0", optionalDependencies: Object.fromEntries(differences.map((_, n) => [`@x/binding-${n}`, "1.0.0"])) } } });
    const all = lockfileRefusal(refused(...differences))!;
    expect(findAbsentOptional(lock, all)).toHaveLength(250);
    // What installFailureFromLog reads: the first 200, and a count of the rest. Unread differences could be anything.
    const read = lockfileRefusal(refused(...differences.slice(0, 200)), 50)!;
    expect(read.omitted).toBe(50);
    expect(findAbsentOptional(lock, read)).toBeNull();
  });
});

describe("findAbsentOptional", () => {
  /** package-lock.json of the Vite react-ts scaffold as `npm install` wrote it on 2026-11-24 (entries of interest only). */
  const lockfile = {
    name: "x",
    lockfileVersion: 3,
    requires: true,
    packages: {
      "": { name: "x", devDependencies: { oxlint: "^1.88.0", vite: "^8.3.4" }, optionalDependencies: { "root-optional": "1.0.0" } },
      "node_modules/oxlint": {
        version: "1.94.0",
        dev: true,
        optionalDependencies: { "@oxlint/binding-android-arm-eabi": "1.94.0", "@oxlint/binding-linux-x64-gnu": "1.94.0" },
      },
      "node_modules/@oxlint/binding-linux-x64-gnu": { version: "1.94.0", cpu: ["x64"], os: ["linux"], dev: true, optional: true },
      "node_modules/vite": { version: "8.3.8", dependencies: { rolldown: "1.2.19" }, optionalDependencies: { fsevents: "~2.3.3" } },
      "node_modules/rolldown": { version: "1.2.19", optionalDependencies: { "@rolldown/binding-android-arm-eabi": "1.2.19" } },
      "node_modules/fsevents": { version: "2.3.3", os: ["darwin"], optional: true },
    },
  };
  const text = JSON.stringify(lockfile);
  const missing = (...names: string[]) => ({ missing: names.map((name) => ({ name, version: "" })), invalid: [], said: [], omitted: 0 });

  it("recognises optional dependencies of locked packages that have no entry of their own, with their parents", () => {
    expect(findAbsentOptional(text, missing("@oxlint/binding-android-arm-eabi", "@rolldown/binding-android-arm-eabi"))).toEqual([
      { name: "@oxlint/binding-android-arm-eabi", version: "", parents: ["oxlint@1.94.0"] },
      { name: "@rolldown/binding-android-arm-eabi", version: "", parents: ["rolldown@1.2.19"] },
    ]);
  });

  it("calls anything else a real mismatch: a dependency of package.json, an Invalid line, an entry that exists, a package nothing names", () => {
    expect(findAbsentOptional(text, missing("root-optional"))).toBeNull(); // package.json's own: npm install fixes it
    expect(findAbsentOptional(text, missing("@oxlint/binding-android-arm-eabi", "left-pad"))).toBeNull();
    expect(findAbsentOptional(text, missing("fsevents"))).toBeNull();
    expect(
      findAbsentOptional(text, { ...missing("@oxlint/binding-android-arm-eabi"), invalid: ["Invalid: lock file's react@19.0.0 does not satisfy react@19.3.1"] }),
    ).toBeNull();
    expect(findAbsentOptional(text, missing())).toBeNull();
    expect(findAbsentOptional("not json", missing("@oxlint/binding-android-arm-eabi"))).toBeNull();
    expect(findAbsentOptional(JSON.stringify({ lockfileVersion: 1, dependencies: {} }), missing("x"))).toBeNull();
  });

  it("reads the committed fixture's lockfile: rolldown's platform packages are optional", () => {
    const fixture = readFileSync(new URL("../fixtures/sites/vite-react/package-lock.json", import.meta.url), "utf8");
    expect(findAbsentOptional(fixture, missing("@rolldown/binding-android-arm-eabi"))).toBeNull(); // it has its entry
    const without = JSON.parse(fixture);
    delete without.packages["node_modules/@rolldown/binding-android-arm-eabi"];
    expect(findAbsentOptional(JSON.stringify(without), missing("@rolldown/binding-android-arm-eabi"))?.[0]?.parents).toEqual(["rolldown@1.2.19"]);
  });

  it("says in one line which package, of which parent, why npm ci refused and what is done instead", () => {
    const note = absentOptionalNote([{ name: "@oxlint/binding-android-arm-eabi", version: "", parents: ["oxlint@1.94.0"] }], NPM_INSTALL_KEEPING_LOCKFILE);
    expect(note).toBe(
      "npm ci refused package-lock.json: it names @oxlint/binding-android-arm-eabi (an optional dependency of oxlint@1.94.0) but has no entry for it " +
        "(the registry did not have it when the lockfile was written, and still does not); installing with `npm install --no-audit --no-fund --no-save` instead, " +
        "which keeps every version the lockfile pins and leaves out optional packages the registry lacks or this platform does not use",
    );
    expect(note).not.toContain("\n");
    // The registry has it by now (npm resolved a version): the lockfile was written before it was published.
    const two = absentOptionalNote(
      [
        { name: "@oxlint/binding-android-arm-eabi", version: "1.94.0", parents: ["oxlint@1.94.0"] },
        { name: "@rolldown/binding-android-arm-eabi", version: "1.2.19", parents: ["rolldown@1.2.19"] },
      ],
      NPM_INSTALL_KEEPING_LOCKFILE,
    );
    expect(two).toMatch(
      /^npm ci refused package-lock\.json: it names @oxlint\/binding-android-arm-eabi \(an optional dependency of oxlint@1\.94\.0\), @rolldown\/binding-android-arm-eabi \(an optional dependency of rolldown@1\.2\.19\) but has no entries for them \(usually because the registry did not have them yet when the lockfile was written\); /,
    );
  });
});
