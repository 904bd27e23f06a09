"""A precompiled header for GCC, compiled with the C++ toolchain's own flags.

Bazel 4 has no rule for precompiled headers. `cc_pch` compiles one header
into `<name>.h.gch` beside a copy of it, `<name>.h`, in the package's output
directory, with exactly the flags the configuration gives every C++ compile
(`--copt`, `--cxxopt`, `-c opt`, the sanitizer configs), position-independent
as `--force_pic` makes every object. A target uses it by depending on the
rule and adding `pch_copts(label)` to its `copts`: GCC then reads the
compiled header instead of parsing the headers it names, and
`-Winvalid-pch` turns a header it would reject (flags that differ) into a
warning, which `-Werror` makes a build error, so the speed-up cannot go away
unnoticed. The header must only include other headers: whatever it
declares is visible to every file of the targets that use it.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "CPP_COMPILE_ACTION_NAME")

def _cc_pch_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    features = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    header = ctx.actions.declare_file(ctx.label.name + ".h")
    ctx.actions.symlink(output = header, target_file = ctx.file.header)
    gch = ctx.actions.declare_file(ctx.label.name + ".h.gch")
    variables = cc_common.create_compile_variables(
        feature_configuration = features,
        cc_toolchain = cc_toolchain,
        user_compile_flags = ctx.fragments.cpp.copts + ctx.fragments.cpp.cxxopts +
                             ["-x", "c++-header"],
        source_file = header.path,
        output_file = gch.path,
        use_pic = True,
        quote_include_directories = depset([".", ctx.bin_dir.path]),
    )
    ctx.actions.run(
        executable = cc_common.get_tool_for_action(
            feature_configuration = features,
            action_name = CPP_COMPILE_ACTION_NAME,
        ),
        arguments = cc_common.get_memory_inefficient_command_line(
            feature_configuration = features,
            action_name = CPP_COMPILE_ACTION_NAME,
            variables = variables,
        ),
        env = cc_common.get_environment_variables(
            feature_configuration = features,
            action_name = CPP_COMPILE_ACTION_NAME,
            variables = variables,
        ),
        inputs = depset([header], transitive = [cc_toolchain.all_files]),
        outputs = [gch],
        mnemonic = "CppPch",
        progress_message = "Precompiling %s" % ctx.file.header.short_path,
    )
    return [
        DefaultInfo(files = depset([header, gch])),
        CcInfo(compilation_context = cc_common.create_compilation_context(
            headers = depset([header, gch]),
        )),
    ]

cc_pch = rule(
    implementation = _cc_pch_impl,
    attrs = {
        "header": attr.label(allow_single_file = [".h"], mandatory = True),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def pch_copts(label):
    """The copts that make a target's compiles read the cc_pch `label`
    (`//package:name`) first."""
    package, _, name = label.lstrip("/").partition(":")
    return ["-include", "%s/%s.h" % (package, name), "-Winvalid-pch"]
