# Obtains the pinned llama.cpp source, applies patches/*.patch in order and
# returns the patched tree.
#
# The source is the llama.cpp that llama-cpp-python 0.3.36 vendors in its PyPI
# sdist (vendor/llama.cpp, upstream commit 0c1e570), so that our patched
# libllama and llama-cpp-python's own libllama come from the same code.
#
# Override for offline builds (CMake variable or environment variable of the
# same name):
#   LLAMA_EXTRAPOLATE_SOURCE=/path/llama_cpp_python-0.3.36.tar.gz   (verified by sha256)
#   LLAMA_EXTRAPOLATE_SOURCE=/path/llama_cpp_python-0.3.36          (an extracted sdist)
#   LLAMA_EXTRAPOLATE_SOURCE=/path/llama.cpp                        (a llama.cpp tree)
# A directory is copied before patching; it is never modified.

set(LLAMA_EXTRAPOLATE_SDIST_NAME    "llama-cpp-python")
set(LLAMA_EXTRAPOLATE_SDIST_VERSION "0.3.36")
set(LLAMA_EXTRAPOLATE_SDIST_FILE    "llama_cpp_python-0.3.36.tar.gz")
set(LLAMA_EXTRAPOLATE_SDIST_SHA256  "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")
set(LLAMA_EXTRAPOLATE_UPSTREAM_COMMIT "0c1e570")

set(LLAMA_EXTRAPOLATE_SOURCE "$ENV{LLAMA_EXTRAPOLATE_SOURCE}" CACHE STRING
    "Local llama.cpp tree, extracted llama-cpp-python sdist, or its tarball (empty: download with pip)")

function(_llama_extrapolate_verify_sdist tarball)
    file(SHA256 "${tarball}" actual)
    if (NOT actual STREQUAL LLAMA_EXTRAPOLATE_SDIST_SHA256)
        message(FATAL_ERROR
            "llama-extrapolate: ${tarball} has sha256 ${actual}, expected "
            "${LLAMA_EXTRAPOLATE_SDIST_SHA256} (${LLAMA_EXTRAPOLATE_SDIST_FILE}). "
            "Point LLAMA_EXTRAPOLATE_SOURCE at the unmodified ${LLAMA_EXTRAPOLATE_SDIST_FILE}, "
            "or unset it to download the pinned sdist.")
    endif()
endfunction()

# Downloads the pinned sdist with pip (so pip's index configuration applies)
# into the build directory, once. Only llama-cpp-python is taken as an sdist:
# pip prepares its metadata in an isolated build environment, and
# --no-binary=:all: would build that environment's cmake from source (more than
# ten minutes on two cores whenever pip has no wheel of that cmake cached).
function(_llama_extrapolate_download_sdist out_tarball)
    set(deps "${CMAKE_BINARY_DIR}/_deps")
    set(tarball "${deps}/${LLAMA_EXTRAPOLATE_SDIST_FILE}")
    if (EXISTS "${tarball}")
        file(SHA256 "${tarball}" cached)
        if (cached STREQUAL LLAMA_EXTRAPOLATE_SDIST_SHA256)
            message(STATUS "llama-extrapolate: using cached ${tarball}")
            set(${out_tarball} "${tarball}" PARENT_SCOPE)
            return()
        endif()
        file(REMOVE "${tarball}")
    endif()
    find_package(Python REQUIRED COMPONENTS Interpreter)
    set(download_dir "${deps}/download")
    file(REMOVE_RECURSE "${download_dir}")
    message(STATUS "llama-extrapolate: downloading ${LLAMA_EXTRAPOLATE_SDIST_NAME}==${LLAMA_EXTRAPOLATE_SDIST_VERSION} sdist with pip")
    execute_process(
        COMMAND "${Python_EXECUTABLE}" -m pip download --no-deps "--no-binary=${LLAMA_EXTRAPOLATE_SDIST_NAME}"
                --dest "${download_dir}"
                "${LLAMA_EXTRAPOLATE_SDIST_NAME}==${LLAMA_EXTRAPOLATE_SDIST_VERSION}"
        RESULT_VARIABLE rc
        OUTPUT_VARIABLE out
        ERROR_VARIABLE  err)
    if (NOT rc EQUAL 0 OR NOT EXISTS "${download_dir}/${LLAMA_EXTRAPOLATE_SDIST_FILE}")
        message(FATAL_ERROR
            "llama-extrapolate: could not download ${LLAMA_EXTRAPOLATE_SDIST_NAME}==${LLAMA_EXTRAPOLATE_SDIST_VERSION} "
            "with pip (exit ${rc}). For an offline build set LLAMA_EXTRAPOLATE_SOURCE to a local "
            "${LLAMA_EXTRAPOLATE_SDIST_FILE} or llama.cpp tree.\n${out}\n${err}")
    endif()
    _llama_extrapolate_verify_sdist("${download_dir}/${LLAMA_EXTRAPOLATE_SDIST_FILE}")
    file(RENAME "${download_dir}/${LLAMA_EXTRAPOLATE_SDIST_FILE}" "${tarball}")
    file(REMOVE_RECURSE "${download_dir}")
    set(${out_tarball} "${tarball}" PARENT_SCOPE)
endfunction()

# llama_extrapolate_patched_source(<out_dir> <out_patch_names> PATCHES <files...>)
function(llama_extrapolate_patched_source out_dir out_patch_names)
    cmake_parse_arguments(ARG "" "" "PATCHES" ${ARGN})
    set(deps "${CMAKE_BINARY_DIR}/_deps")

    # 1. where the pristine source comes from
    set(origin "${LLAMA_EXTRAPOLATE_SOURCE}")
    set(tarball "")
    set(tree "")
    if (origin STREQUAL "")
        _llama_extrapolate_download_sdist(tarball)
    elseif (IS_DIRECTORY "${origin}")
        if (EXISTS "${origin}/vendor/llama.cpp/include/llama.h")
            set(tree "${origin}/vendor/llama.cpp")
        elseif (EXISTS "${origin}/include/llama.h")
            set(tree "${origin}")
        else()
            message(FATAL_ERROR
                "llama-extrapolate: LLAMA_EXTRAPOLATE_SOURCE=${origin} is neither a llama.cpp tree "
                "(no include/llama.h) nor an extracted llama-cpp-python sdist (no vendor/llama.cpp). "
                "Point it at one of those or at ${LLAMA_EXTRAPOLATE_SDIST_FILE}.")
        endif()
    elseif (EXISTS "${origin}")
        _llama_extrapolate_verify_sdist("${origin}")
        set(tarball "${origin}")
    else()
        message(FATAL_ERROR
            "llama-extrapolate: LLAMA_EXTRAPOLATE_SOURCE=${origin} does not exist. "
            "Point it at ${LLAMA_EXTRAPOLATE_SDIST_FILE}, an extracted sdist or a llama.cpp tree, or unset it.")
    endif()

    # 2. a stamp that changes whenever the source or any patch changes
    set(stamp_text "source=${tarball}${tree}\n")
    if (tarball)
        string(APPEND stamp_text "sha256=${LLAMA_EXTRAPOLATE_SDIST_SHA256}\n")
    endif()
    set(names "")
    foreach(patch IN LISTS ARG_PATCHES)
        get_filename_component(name "${patch}" NAME)
        file(SHA256 "${patch}" h)
        string(APPEND stamp_text "${name}=${h}\n")
        list(APPEND names "${name}")
        set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${patch}")
    endforeach()

    set(dir "${deps}/llama.cpp")
    set(stamp "${deps}/llama.cpp.stamp")
    set(old_stamp "")
    if (EXISTS "${stamp}" AND EXISTS "${dir}/include/llama.h")
        file(READ "${stamp}" old_stamp)
    endif()

    if (NOT old_stamp STREQUAL stamp_text)
        file(REMOVE "${stamp}")
        file(REMOVE_RECURSE "${dir}" "${deps}/extract")
        if (tarball)
            message(STATUS "llama-extrapolate: extracting vendor/llama.cpp from ${tarball}")
            string(REPLACE ".tar.gz" "" top "${LLAMA_EXTRAPOLATE_SDIST_FILE}")
            file(ARCHIVE_EXTRACT INPUT "${tarball}" DESTINATION "${deps}/extract"
                 PATTERNS "${top}/vendor/llama.cpp")
            file(RENAME "${deps}/extract/${top}/vendor/llama.cpp" "${dir}")
            file(REMOVE_RECURSE "${deps}/extract")
        else()
            message(STATUS "llama-extrapolate: copying ${tree}")
            file(COPY "${tree}/" DESTINATION "${dir}")
        endif()
        # the tree keeps the sdist's file times: a file back to its upstream text after a patch was
        # dropped or changed would look older than its object from the last build, and ninja would
        # keep the stale object; the extraction time makes the build recompile (ccache keeps it cheap)
        file(GLOB_RECURSE extracted LIST_DIRECTORIES false "${dir}/*")
        file(TOUCH_NOCREATE ${extracted})

        find_program(LLAMA_EXTRAPOLATE_PATCH_EXECUTABLE patch)
        if (NOT LLAMA_EXTRAPOLATE_PATCH_EXECUTABLE AND ARG_PATCHES)
            message(FATAL_ERROR "llama-extrapolate: the 'patch' program is needed to apply patches/ (e.g. apt-get install patch)")
        endif()
        foreach(patch IN LISTS ARG_PATCHES)
            get_filename_component(name "${patch}" NAME)
            # dry run first, so a patch that does not apply leaves no half-applied hunks
            foreach(mode "--dry-run" "")
                execute_process(
                    COMMAND "${LLAMA_EXTRAPOLATE_PATCH_EXECUTABLE}" -p1 --forward --batch --fuzz=0
                            --no-backup-if-mismatch ${mode} -d "${dir}" -i "${patch}"
                    RESULT_VARIABLE rc
                    OUTPUT_VARIABLE out
                    ERROR_VARIABLE  err)
                if (NOT rc EQUAL 0)
                    message(FATAL_ERROR
                        "llama-extrapolate: patch ${name} does not apply to llama.cpp ${LLAMA_EXTRAPOLATE_UPSTREAM_COMMIT}:\n${out}${err}")
                endif()
            endforeach()
            message(STATUS "llama-extrapolate: applied ${name}")
        endforeach()
        file(WRITE "${stamp}" "${stamp_text}")
    else()
        message(STATUS "llama-extrapolate: patched llama.cpp is up to date (${dir})")
    endif()

    set(${out_dir} "${dir}" PARENT_SCOPE)
    set(${out_patch_names} "${names}" PARENT_SCOPE)
endfunction()
