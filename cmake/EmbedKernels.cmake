# Embeds every GLSL compute source under a folder into one generated C++ file, so the binary
# carries its kernels and needs no files at run time.
function(meganeura_embed_kernels source_dir output)
  file(GLOB kernel_files CONFIGURE_DEPENDS ${source_dir}/*.comp ${source_dir}/*.glsl)
  add_custom_command(
    OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${output} -DSOURCE_DIR=${source_dir}
            -P ${CMAKE_SOURCE_DIR}/cmake/EmbedKernelsScript.cmake
    DEPENDS ${kernel_files} ${CMAKE_SOURCE_DIR}/cmake/EmbedKernelsScript.cmake
    COMMENT "Embedding GLSL kernels")
endfunction()
